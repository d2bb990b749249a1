// kilnd's web page: jobs, live training curves, comparison, models. Plain JS, no framework; data
// from kilnd's /api (JSON, proto3 field names) and the KServe v2 REST routes, live updates from
// Server-Sent Events read with fetch() so that the bearer token travels in a header, never in a
// URL (EventSource cannot send one).
'use strict';

const TOKEN_KEY = 'kiln-token';
const $ = (sel, root = document) => root.querySelector(sel);
const main = $('#main');
let viewAbort = new AbortController();  // aborted when the view changes: ends its streams

// ---- HTTP ------------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function authHeaders(extra = {}) {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? {...extra, Authorization: 'Bearer ' + token} : extra;
}

async function errorOf(res) {
  let message = res.status + ' ' + res.statusText;
  try {
    const body = await res.json();
    if (body.error) message = body.error;
  } catch (_) { /* not JSON */
  }
  return new ApiError(res.status, message);
}

// Resolves to the fetch Response; a 401 asks for a token and tries once more.
async function request(path, options = {}) {
  const send = () => fetch(path, {...options, headers: authHeaders(options.headers || {})});
  let res = await send();
  if (res.status === 401) {
    await askForToken();
    res = await send();
  }
  if (!res.ok) throw await errorOf(res);
  return res;
}

async function api(path, options = {}) {
  const res = await request(path, options);
  const text = await res.text();
  return text ? JSON.parse(text) : {};
}

function post(path, body) {
  return api(path, {
    method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: body === undefined ? '' : JSON.stringify(body),
  });
}

let tokenWaiters = null;
function askForToken() {
  if (!tokenWaiters) {
    tokenWaiters = new Promise((resolve) => {
      const dialog = $('#token-dialog');
      $('#token-form').onsubmit = () => {
        sessionStorage.setItem(TOKEN_KEY, $('#token-input').value.trim());
        $('#forget-token').hidden = false;
        tokenWaiters = null;
        resolve();
      };
      if (!dialog.open) dialog.showModal();
      $('#token-input').focus();
    });
  }
  return tokenWaiters;
}

// Reads a text/event-stream body: calls onEvent(name, data) per event ("message" when unnamed).
// Resolves when the stream ends; rejects on an HTTP error or a broken connection.
async function readEvents(path, onEvent, signal) {
  let res;
  // kilnd bounds its open streams (503 past it); one a closed page held is freed within seconds.
  for (let wait = 500;; wait *= 2) {
    try {
      res = await request(path, {signal});
      break;
    } catch (e) {
      if (e.status !== 503 || wait > 8000) throw e;
      await new Promise((r) => setTimeout(r, wait));
    }
  }
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  setLive(true);
  try {
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = 'message';
        const data = [];
        for (const line of block.split('\n')) {
          if (line.startsWith('event: '))
            name = line.slice(7);
          else if (line.startsWith('data: '))
            data.push(line.slice(6));
        }
        // A handler's own failure (or its abort when the view changes) is reported, not thrown.
        if (data.length)
          Promise.resolve(onEvent(name, JSON.parse(data.join('\n')))).catch(reportError);
      }
    }
  } finally {
    setLive(false);
  }
}

let liveStreams = 0;
function setLive(on) {
  liveStreams += on ? 1 : -1;
  const el = $('#live');
  el.classList.toggle('on', liveStreams > 0);
  el.textContent = liveStreams > 0 ? 'live' : '';
}

function showMessage(text, ok = false) {
  const el = $('#message');
  el.textContent = text;
  el.classList.toggle('ok', ok);
  el.hidden = !text;
}

function reportError(e) {
  if (e && e.name === 'AbortError') return;  // the view changed: its requests were cancelled
  showMessage(e.message || String(e));
}

// ---- formatting --------------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k.startsWith('on'))
      node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null && v !== false)
      node.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat())
    node.append(c instanceof Node ? c : document.createTextNode(c ?? ''));
  return node;
}

const stateName = (s) => String(s || '').replace('JOB_STATE_', '');
const percent = (x) => (100 * x).toFixed(2) + '%';
function modelSummary(spec) {
  const layers = (spec.model && spec.model.layers) || [];
  if (layers.length)
    return `custom (${layers.length} layers)` + (spec.preset ? ' on ' + spec.preset : '');
  return spec.preset || '-';
}
function age(timestamp) {
  if (!timestamp) return '-';
  const s = Math.max(0, (Date.now() - Date.parse(timestamp)) / 1000);
  if (s < 60) return Math.floor(s) + 's';
  if (s < 3600) return Math.floor(s / 60) + 'm';
  if (s < 86400) return Math.floor(s / 3600) + 'h';
  return Math.floor(s / 86400) + 'd';
}
// Ranks of a data-parallel job (spec.workers; 0 or 1: one, inside kilnd), as `kiln get` says.
const workersText = (spec) =>
    String(Math.max(1, spec.workers || 0)) + (spec.external_workers ? ' (external)' : '');
const ended = (job) => ['SUCCEEDED', 'FAILED', 'CANCELLED'].includes(stateName(job.state));

// "adam lr=0.001", as `kiln get` words an optimizer: its kind, then the fields it sets.
function optimizerText(opt) {
  const words = [String(opt.kind).replace('KIND_', '').toLowerCase()];
  for (const f
           of ['lr', 'weight_decay', 'momentum', 'dampening', 'nesterov', 'beta1', 'beta2',
               'eps']) {
    if (opt[f] !== undefined && opt[f] !== 0 && opt[f] !== false) words.push(`${f}=${opt[f]}`);
  }
  if (opt.weight_decay_rule === 'WEIGHT_DECAY_RULE_MATRICES')
    words.push('weight_decay_rule=matrices');
  return words.join(' ');
}
// The optimizer and batch size a job trains with, as `kiln get` shows them: the spec's own, else
// what kilnd resolved from its preset (job.resolved_spec), marked so. A kilnd from before
// resolved_spec sends none: then "-".
function recipe(job) {
  const spec = job.spec || {};
  const resolved = job.resolved_spec || {};
  const from = spec.preset ? ` (${spec.preset}'s)` : '';
  const hasKind = (o) => o && o.kind && o.kind !== 'KIND_UNSPECIFIED';
  const optimizer = hasKind(spec.optimizer) ? optimizerText(spec.optimizer) :
      hasKind(resolved.optimizer)           ? optimizerText(resolved.optimizer) + from :
                                              '-';
  const batch = spec.batch_size ? String(spec.batch_size) :
      resolved.batch_size       ? resolved.batch_size + from :
                                  '-';
  return {optimizer, batch};
}

// ---- charts ------------------------------------------------------------------------------------

const haveCharts = typeof uPlot !== 'undefined';
const COLOURS = ['#b4470c', '#0969da', '#1a7f37', '#8250df', '#cf222e', '#9a6700', '#1b7c83'];

// Tick labels with as many decimals as the step between ticks needs, so neighbours differ
// (uPlot's default keeps 3: ticks 0.00175 and 0.002 both read "0.002"). Past 6 decimals,
// exponents ("2.5e-7").
function tickLabels(splits, incr) {
  let decimals = 0;
  while (decimals < 15) {
    const scaled = incr * 10 ** decimals;
    if (Math.abs(scaled - Math.round(scaled)) <= 1e-6 * scaled) break;
    decimals++;
  }
  return splits.map((v) => {
    if (v == null) return '';
    if (decimals <= 6 || v === 0) return v.toFixed(Math.min(decimals, 6));
    const digits = decimals + Math.floor(Math.log10(Math.abs(v)));
    return v.toExponential(Math.min(20, Math.max(0, digits)));
  });
}

// A y axis's size rule: as wide as its longest tick label needs (uPlot's default, 50 px, cuts
// "0.00105"), never narrower than before, since uPlot lays out in a few cycles whose ticks (and
// so their decimals) may differ, and the last cycle's labels must fit.
function yAxisWidth() {
  let widest = 0;
  return (u, values, axisIdx) => {
    const axis = u.axes[axisIdx];
    const longest =
        (values || []).reduce((a, v) => (String(v).length > a.length ? String(v) : a), '');
    u.ctx.font = axis.font[0];
    const width = axis.ticks.size + axis.gap + u.ctx.measureText(longest).width / devicePixelRatio;
    widest = Math.max(widest, Math.ceil(width));
    return widest;
  };
}

// A uPlot chart in `container` that follows its width; `series` are the y series' labels.
// Its y axis's latest tick labels are kept in box.dataset.yTicks (JSON), for the browser test.
function makeChart(container, title, xLabel, series, {yRange} = {}) {
  const box = el('div', {class: 'chart'}, el('h3', {}, title));
  container.append(box);
  if (!haveCharts) {
    box.append(
        el('p', {class: 'note'}, 'Charts are not available: this kilnd was built without uPlot.'));
    return {setData() {}, box};
  }
  const width = () => Math.max(260, box.clientWidth || 320);
  const plot = new uPlot(
      {
        width: width(),
        height: 220,
        scales: {x: {time: false}, ...(yRange ? {y: {range: yRange}} : {})},
        axes: [
          {label: xLabel}, {
            values: (u, splits, axis, space, incr) => {
              const labels = tickLabels(splits, incr);
              box.dataset.yTicks = JSON.stringify(labels);
              return labels;
            },
            size: yAxisWidth(),
          }
        ],
        series: [
          {label: xLabel}, ...series.map((label, i) => ({
                                           label,
                                           stroke: COLOURS[i % COLOURS.length],
                                           width: 1.5,
                                           spanGaps: true,
                                           // uPlot's rule: points where they are sparse enough
                                           // to tell apart, so one epoch's lone point shows.
                                         }))
        ],
      },
      [[], ...series.map(() => [])], box);
  new ResizeObserver(() => plot.setSize({width: width(), height: 220})).observe(box);
  let pending = null;
  return {
    box,
    // Redraws at most once a frame, however fast points arrive.
    setData(data) {
      pending = data;
      requestAnimationFrame(() => {
        if (pending) {
          plot.setData(pending);
          pending = null;
        }
      });
    },
  };
}

// A job's curves as events arrive: train loss and learning rate per step, test accuracy per
// epoch. Counts the points that arrived live (not replayed) for the browser test.
class JobCurves {
  constructor() {
    this.step = [];
    this.loss = [];
    this.lr = [];
    this.epoch = [];
    this.testAccuracy = [];
    this.trainAccuracy = [];
    this.testLoss = [];
    this.livePoints = 0;
  }
  // A run resumed from an earlier checkpoint trains those steps and epochs again: its points
  // replace the ones from there on, so each curve is the job's current history and its x stays
  // increasing (as uPlot needs).
  add(event) {
    if (event.step) {
      const step = Number(event.step.global_step);
      while (this.step.length && this.step[this.step.length - 1] >= step) {
        this.step.pop();
        this.loss.pop();
        this.lr.pop();
      }
      this.step.push(step);
      this.loss.push(event.step.loss);
      this.lr.push(event.step.lr);
      if (!event.replayed) this.livePoints++;
    } else if (event.epoch) {
      while (this.epoch.length && this.epoch[this.epoch.length - 1] >= event.epoch.epoch) {
        this.epoch.pop();
        this.testAccuracy.pop();
        this.trainAccuracy.pop();
        this.testLoss.pop();
      }
      this.epoch.push(event.epoch.epoch);
      this.testAccuracy.push(event.epoch.test_accuracy);
      this.trainAccuracy.push(event.epoch.train_accuracy);
      // No test split: no point (uPlot leaves a gap for null).
      this.testLoss.push(Number(event.epoch.test_samples) > 0 ? event.epoch.test_loss : null);
      if (!event.replayed) this.livePoints++;
    }
  }
}

// ---- jobs --------------------------------------------------------------------------------------

// Who made a job: "user/team", "user" for an admin of no team, "-" for one of no owner (made
// before identities or while auth was off), as `kiln jobs` writes it.
function ownerText(owner) {
  if (!owner || (!owner.user && !owner.team)) return '-';
  return owner.team ? `${owner.user}/${owner.team}` : owner.user;
}

function jobRow(job, selected) {
  const id = job.id;
  const spec = job.spec || {};
  const showAcc = job.epochs_done > 0 && Number(job.last_epoch && job.last_epoch.test_samples) > 0;
  return el(
      'tr', {
        class: 'clickable',
        'data-job-id': id,
        onclick: (e) => {
          if (e.target.type !== 'checkbox') location.hash = '#/jobs/' + id;
        }
      },
      el('td', {}, el('input', {
           type: 'checkbox',
           'aria-label': 'compare ' + id,
           checked: selected.has(id),
           onchange: (e) => {
             e.target.checked ? selected.add(id) : selected.delete(id);
           }
         })),
      el('td', {}, id), el('td', {}, spec.name || '-'), el('td', {}, ownerText(job.owner)),
      el('td', {class: 'state state-' + stateName(job.state)}, stateName(job.state)),
      el('td', {}, modelSummary(spec)), el('td', {}, spec.dataset || '-'),
      el('td', {}, job.device || '-'), el('td', {class: 'num'}, workersText(spec)),
      el('td', {class: 'num'},
         el('progress',
            {value: job.epochs_done, max: Math.max(1, job.epochs), 'aria-label': 'epochs done'}),
         ` ${job.epochs_done}/${job.epochs}`),
      el('td', {class: 'num'}, String(job.global_step)),
      el('td', {class: 'num'}, showAcc ? percent(job.last_epoch.test_accuracy) : '-'),
      el('td', {class: 'num'}, job.best_test_accuracy > 0 ? percent(job.best_test_accuracy) : '-'),
      el('td', {class: 'num'}, age(job.create_time)));
}

async function showJobs(signal) {
  const selected = new Set();
  const tbody = el('tbody');
  main.replaceChildren(
      el('h2', {}, 'Jobs'),
      el('div', {class: 'actions'},
         el('button', {
           type: 'button',
           onclick: () => {
             if (selected.size < 2) return showMessage('Tick two or more jobs to compare.');
             location.hash = '#/compare/' + [...selected].join(',');
           }
         },
            'Compare selected')),
      el('div', {class: 'table-wrap'},
         el('table', {id: 'jobs'},
            el('thead', {},
               el('tr', {},
                  [
                    '', 'JOB', 'NAME', 'OWNER', 'STATE', 'MODEL', 'DATASET', 'DEVICE', 'WORKERS',
                    'EPOCHS', 'STEP', 'TEST ACC', 'BEST ACC', 'AGE'
                  ].map((h, i) => el('th', {class: i >= 8 ? 'num' : ''}, h)))),
            tbody)),
      el('p', {class: 'note', id: 'jobs-empty', hidden: true},
         'No jobs yet; start one with: kiln submit --preset mnist-mlp --watch'),
      el('p', {class: 'note', id: 'jobs-more', hidden: true},
         'The newest 100 jobs are shown; `kiln jobs` lists them all.'));
  const rows = new Map();
  const render = (jobs) => {
    tbody.replaceChildren();
    rows.clear();
    for (const job of jobs) {
      const row = jobRow(job, selected);
      rows.set(job.id, row);
      tbody.append(row);
    }
    $('#jobs-empty').hidden = jobs.length > 0;
  };
  const reload = async () => {
    const page = await api('/api/jobs', {signal});
    render(page.jobs);
    $('#jobs-more').hidden = !page.next_page_token;
  };
  // The table is read when the stream opens, then each changed job is read again as the stream
  // names it: nothing polls.
  // A stream kilnd ends for its age (DEADLINE_EXCEEDED) is opened again.
  for (let again = true; again;) {
    again = false;
    await readEvents('/api/events', async (name, data) => {
      try {
        if (name === 'end' && data.code === 'DEADLINE_EXCEEDED') again = true;
        if (name === 'open') await reload();
        if (name !== 'jobs') return;
        for (const id of data.job_ids) {
          const job = await api('/api/jobs/' + encodeURIComponent(id), {signal});
          const old = rows.get(id);
          if (!old) {
            await reload();
            return;
          }  // a new job: the list puts it in its place
          const row = jobRow(job, selected);
          old.replaceWith(row);
          rows.set(id, row);
        }
      } catch (e) {
        reportError(e);
      }
    }, signal);
  }
}

async function showJob(id, signal) {
  const path = '/api/jobs/' + encodeURIComponent(id);
  const facts = el('dl', {class: 'facts'});
  const reason = el('p', {class: 'reason', id: 'job-reason'});
  const actions = el('div', {class: 'actions'});
  const charts = el('div', {class: 'charts'});
  const checkpoints = el('tbody');
  const spec = el('pre');
  main.replaceChildren(
      el('h2', {}, 'Job ', el('span', {id: 'job-id'}, id)), facts, reason, actions,
      el('h2', {}, 'Curves'), charts, el('h2', {}, 'Checkpoints'),
      el('div', {class: 'actions'}, 'Deploy as model ',
         el('input', {id: 'deploy-name', value: id, 'aria-label': 'model name', size: 18})),
      el('div', {class: 'table-wrap'},
         el('table', {id: 'checkpoints'},
            el('thead', {},
               el('tr', {},
                  ['ID', 'KIND', 'EPOCHS', 'STEP', 'TEST ACC', 'SIZE', 'WRITTEN',
                   ''].map((h) => el('th', {}, h)))),
            checkpoints)),
      el('details', {}, el('summary', {}, 'Spec and hyperparameters'), spec));

  const loss = makeChart(charts, 'Train loss per step', 'step', ['loss']);
  loss.box.id = 'loss-chart';
  const accuracy =
      makeChart(charts, 'Accuracy per epoch', 'epoch', ['test', 'train'], {yRange: [0, 1]});
  accuracy.box.id = 'accuracy-chart';
  // A language model's validation loss (its perplexity is e to it), a classifier's test loss.
  const testLoss = makeChart(charts, 'Test / validation loss per epoch or interval', 'epoch',
                             ['test loss']);
  testLoss.box.id = 'test-loss-chart';
  const lr = makeChart(charts, 'Learning rate per step', 'step', ['lr']);
  lr.box.id = 'lr-chart';
  const curves = new JobCurves();
  const draw = () => {
    loss.setData([curves.step, curves.loss]);
    accuracy.setData([curves.epoch, curves.testAccuracy, curves.trainAccuracy]);
    testLoss.setData([curves.epoch, curves.testLoss]);
    lr.setData([curves.step, curves.lr]);
    loss.box.dataset.points = curves.step.length;
    loss.box.dataset.livePoints = curves.livePoints;
  };

  const renderJob = (job) => {
    const s = job.spec || {};
    const trains = recipe(job);
    const entries = [
      ['state', stateName(job.state)],
      ['name', s.name || '-'],
      ['owner', ownerText(job.owner)],
      ['model', modelSummary(s)],
      ['parameters', job.parameter_count],
      ['dataset', s.dataset],
      ['device', job.device],
      ['precision', job.precision_text || 'fp32'],
      ['workers', workersText(s)],
      ['epochs', `${job.epochs_done}/${job.epochs}`],
      ['step', job.global_step],
      ['batch size', trains.batch],
      ['optimizer', trains.optimizer],
      ['best test accuracy', job.best_test_accuracy > 0 ? percent(job.best_test_accuracy) : '-'],
      ['attempts', job.attempts],
      ['retries', job.retries || 0],
      ['created', job.create_time || '-'],
    ];
    facts.replaceChildren(
        ...entries.flatMap(([k, v]) => [el('dt', {}, k), el('dd', {'data-fact': k}, String(v))]));
    reason.textContent = job.reason ? 'Reason: ' + job.reason : '';
    spec.textContent = JSON.stringify(job.spec, null, 2);
    const state = stateName(job.state);
    const act = (label, fn, enabled) =>
        el('button', {
          type: 'button',
          disabled: !enabled,
          onclick: async (e) => {
            e.target.disabled = true;
            try {
              await fn();
            } catch (err) {
              reportError(err);
            } finally {
              e.target.disabled = false;
            }
          }
        },
           label);
    const epochsInput = el('input', {
      type: 'number',
      min: 0,
      value: '',
      placeholder: 'epochs',
      size: 6,
      'aria-label': 'epochs to resume to'
    });
    actions.replaceChildren(
        act('Cancel', async () => {
          renderJob(await post(path + '/cancel'));
          showMessage('Cancelled ' + id, true);
        }, state === 'RUNNING' || state === 'QUEUED'), act('Checkpoint now', async () => {
          const c = await post(path + '/checkpoint');
          showMessage(`Checkpoint ${c.id} written at step ${c.global_step}`, true);
          loadCheckpoints();
        }, state === 'RUNNING'), act('Resume', async () => {
          const epochs = Number(epochsInput.value || 0);
          renderJob(await post(path + '/resume', epochs > 0 ? {epochs} : {}));
          showMessage('Resumed ' + id, true);
          follow();
        }, ended(job)), epochsInput);
  };

  const loadCheckpoints = async () => {
    const {checkpoints: list} = await api(path + '/checkpoints', {signal});
    checkpoints.replaceChildren(...list.map(
        (c) =>
            el('tr', {'data-checkpoint-id': c.id}, el('td', {}, c.id),
               el('td', {}, String(c.kind).replace('CHECKPOINT_KIND_', '').toLowerCase()),
               el('td', {}, c.epochs_done), el('td', {}, c.global_step),
               el('td', {}, c.epochs_done > 0 ? percent(c.test_accuracy) : '-'),
               el('td', {}, (Number(c.size_bytes) / 1024).toFixed(0) + ' KiB'),
               el('td', {}, c.create_time),
               el('td', {},
                  el('button',
                     {
                       type: 'button',
                       onclick: () => download(
                                          `${path}/checkpoints/${c.id}/file`,
                                          `${id}-checkpoint-${c.id}.safetensors`)
                                          .catch(reportError)
                     },
                     'Download'),
                  ' ',
                  el('button',
                     {
                       type: 'button',
                       class: 'deploy',
                       onclick: () =>
                           deploy($('#deploy-name').value, `${id}@${c.id}`).catch(reportError)
                     },
                     'Deploy')))));
  };

  renderJob(await api(path, {signal}));
  await loadCheckpoints();
  // History, then live events; the job's facts are read again on its state and epoch events.
  const follow = async () => {
    curves.step.length = curves.loss.length = curves.lr.length = 0;
    curves.epoch.length = curves.testAccuracy.length = curves.trainAccuracy.length = 0;
    curves.testLoss.length = 0;
    let historyDone = false, again = false;
    await readEvents(path + '/events?steps=1', async (name, event) => {
      if (name === 'history_end') {
        historyDone = true;
        draw();
        return;
      }
      if (name === 'end' && event.code === 'DEADLINE_EXCEEDED') {
        again = true;  // kilnd ends a stream for its age: it is opened again
        return;
      }
      if (name === 'end') {
        renderJob(await api(path, {signal}));
        await loadCheckpoints();
        if (event.code !== 'OK') showMessage('Live updates ended: ' + event.message);
        return;
      }
      curves.add(event);
      if (historyDone) draw();
      if (event.step && !event.replayed)
        $('[data-fact="step"]').textContent = event.step.global_step;
      if (!event.replayed && (event.state || event.epoch || event.checkpoint)) {
        renderJob(await api(path, {signal}));
        if (event.checkpoint) await loadCheckpoints();
      }
    }, signal);
    draw();
    if (again) await follow();
  };
  await follow();
}

async function download(path, filename) {
  const blob = await (await request(path)).blob();
  const url = URL.createObjectURL(blob);
  const a = el('a', {href: url, download: filename});
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 10000);
}

// Through the KServe v2 repository extension, as `kiln deploy` and Triton clients do.
async function deploy(model, source) {
  if (!model) throw new Error('Name the model to deploy as.');
  await post(
      `/v2/repository/models/${encodeURIComponent(model)}/load`,
      {parameters: {checkpoint: source}});
  showMessage(`Deployed ${source} as ${model}`, true);
  location.hash = '#/models';
}

// ---- compare -----------------------------------------------------------------------------------

async function showCompare(ids, signal) {
  main.replaceChildren(el('h2', {}, 'Compare'));
  if (ids.length < 2) {
    main.append(el(
        'p', {class: 'note'}, 'Tick two or more jobs in the Jobs table, then Compare selected.'));
    return;
  }
  main.append(el('p', {class: 'note'}, 'Jobs: ' + ids.join(', ') + ' (as recorded when opened)'));
  const charts = el('div', {class: 'charts'});
  main.append(charts);
  const curves = [];
  for (const id of ids) {
    const c = new JobCurves();
    // The recorded history only (follow=0): one stream at a time, each ending by itself.
    await readEvents(
        `/api/jobs/${encodeURIComponent(id)}/events?steps=1&follow=0`, (name, event) => {
          if (name === 'message') c.add(event);
        }, signal);
    curves.push(c);
  }
  const joined = (xs, ys) => (haveCharts ? uPlot.join(curves.map((c) => [c[xs], c[ys]])) : []);
  const loss = makeChart(charts, 'Train loss per step', 'step', ids);
  loss.box.id = 'compare-loss-chart';
  loss.setData(joined('step', 'loss'));
  const accuracy = makeChart(charts, 'Test accuracy per epoch', 'epoch', ids, {yRange: [0, 1]});
  accuracy.setData(joined('epoch', 'testAccuracy'));
  loss.box.dataset.series = ids.length;
}

// ---- models ------------------------------------------------------------------------------------

const REFRESH_MODELS_MS = 5000;

async function showModels(signal) {
  const tbody = el('tbody');
  main.replaceChildren(
      el('h2', {}, 'Models'),
      el('div', {class: 'table-wrap'},
         el('table', {id: 'models'},
            el('thead', {},
               el('tr', {},
                  ['MODEL', 'VERSIONS', 'REQUESTS', 'REQ/S', 'P50', 'P90', 'P99', 'TRY',
                   ''].map((h) => el('th', {}, h)))),
            tbody)),
      el('p', {class: 'note', id: 'models-empty', hidden: true},
         'No models deployed; deploy a checkpoint from a job\'s page.'),
      el('p', {class: 'note'},
         'Request counts and latency percentiles come from kilnd\'s serving metrics ' +
             '(as /metrics reports them); the rate is over the last refresh.'));
  let previous = null;
  const ms = (s) => (s > 0 ? (1000 * s).toFixed(s < 0.01 ? 2 : 1) + ' ms' : '-');
  const refresh = async () => {
    const {models} = await api('/api/models', {signal});
    const now = performance.now();
    const rate = (m) => {
      if (!previous || !previous.counts.has(m.name)) return '-';
      return ((m.requests - previous.counts.get(m.name)) / ((now - previous.time) / 1000))
          .toFixed(2);
    };
    $('#models-empty').hidden = models.length > 0;
    // Keep a drop zone that holds a result: re-rendering would clear it.
    const kept =
        new Map([...tbody.querySelectorAll('tr[data-model]')].map((r) => [r.dataset.model, r]));
    tbody.replaceChildren(...models.map((m) => {
      const old = kept.get(m.name);
      const zone = old ? $('.try', old) : tryBox(m.name);
      // data-label: the column's name, shown beside each cell where the table stacks (narrow).
      return el(
          'tr', {'data-model': m.name}, el('td', {'data-label': 'MODEL'}, m.name),
          el('td', {'data-label': 'VERSIONS'},
             ...m.versions.map(
                 (v) => el(
                     'div', {class: 'version'},
                     (v.version ? `v${v.version} ` : '') + v.state +
                         (v.source ? ` (${v.source})` : '') +
                         (v.precision && v.precision !== 'fp32' ? ` ${v.precision}` : '') +
                         (v.reason ? ': ' + v.reason : '')))),
          el('td', {class: 'num', 'data-label': 'REQUESTS'}, String(m.requests)),
          el('td', {class: 'num', 'data-label': 'REQ/S'}, rate(m)),
          el('td', {class: 'num', 'data-label': 'P50'}, ms(m.latency_seconds.p50)),
          el('td', {class: 'num', 'data-label': 'P90'}, ms(m.latency_seconds.p90)),
          el('td', {class: 'num', 'data-label': 'P99'}, ms(m.latency_seconds.p99)),
          el('td', {'data-label': 'TRY'}, zone),
          el('td', {},
             el('button', {
               type: 'button',
               class: 'undeploy',
               onclick: async () => {
                 try {
                   await post(`/v2/repository/models/${encodeURIComponent(m.name)}/unload`, {});
                   showMessage('Undeployed ' + m.name, true);
                   await refresh();
                 } catch (e) {
                   reportError(e);
                 }
               }
             },
                'Undeploy')));
    }));
    previous = {time: now, counts: new Map(models.map((m) => [m.name, m.requests]))};
  };
  await refresh();
  // The repository and the metrics registry (not the job store) are read again while this view
  // is open, for the request rate.
  while (!signal.aborted) {
    await new Promise((r) => setTimeout(r, REFRESH_MODELS_MS));
    if (!signal.aborted) await refresh().catch(reportError);
  }
}

// A drop zone for image models, a prompt box for language models (token ids in: metadata INT64);
// decided once the model's metadata arrives.
function tryBox(model) {
  const box = el('div', {class: 'try'});
  api(`/v2/models/${encodeURIComponent(model)}`)
      .then((meta) => box.append(
                meta.inputs[0].datatype === 'INT64' ? promptBox(model) : dropZone(model)))
      .catch(() => box.append(dropZone(model)));
  return box;
}

// Prompt, max tokens and temperature; Generate streams the answer from generate_stream, one
// server-sent event per token.
function promptBox(model) {
  const prompt = el('textarea', {rows: 2, 'aria-label': 'prompt for ' + model});
  const maxTokens = el('input', {type: 'number', min: 1, value: 200, 'aria-label': 'max tokens'});
  const temperature =
      el('input', {type: 'number', min: 0, step: 0.1, value: 0.8, 'aria-label': 'temperature'});
  const answer = el('pre', {class: 'generated', 'aria-live': 'polite'});
  const button = el('button', {type: 'button'}, 'Generate');
  button.addEventListener('click', () => {
    button.disabled = true;
    answer.textContent = prompt.value;
    generate(model, prompt.value, Number(maxTokens.value), Number(temperature.value), (text) => {
      answer.textContent += text;
    }).catch(reportError).finally(() => {
      button.disabled = false;
    });
  });
  return el('div', {class: 'prompt-box', 'data-model': model}, prompt,
            el('label', {}, 'max tokens ', maxTokens), el('label', {}, 'temperature ', temperature),
            button, answer);
}

async function generate(model, text, maxTokens, temperature, onText) {
  const res = await request(`/v2/models/${encodeURIComponent(model)}/generate_stream`, {
    method: 'POST',
    headers: {'Content-Type': 'application/json'},
    body: JSON.stringify({
      text_input: text,
      parameters: {max_tokens: maxTokens, temperature, seed: Math.floor(Math.random() * 1e9)},
    }),
  });
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let pending = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    pending += value;
    const events = pending.split('\n\n');
    pending = events.pop();
    for (const event of events) {
      if (!event.startsWith('data: ')) continue;
      const data = JSON.parse(event.slice(6));
      if (data.error) throw new Error(data.error);
      onText(data.text_output ?? '');
    }
  }
}

function dropZone(model) {
  const result = el('div', {class: 'classify-result', 'aria-live': 'polite'});
  const input = el('input', {type: 'file', accept: 'image/*', 'aria-label': 'image for ' + model});
  const zone = el('div', {class: 'dropzone', 'data-model': model}, 'Drop an image', input, result);
  const run = (file) => classify(model, file)
                            .then((text) => {
                              result.textContent = text;
                            })
                            .catch((e) => {
                              result.textContent = '';
                              reportError(e);
                            });
  input.addEventListener('change', () => input.files[0] && run(input.files[0]));
  zone.addEventListener('dragover', (e) => {
    e.preventDefault();
    zone.classList.add('over');
  });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (e) => {
    e.preventDefault();
    zone.classList.remove('over');
    if (e.dataTransfer.files[0]) run(e.dataTransfer.files[0]);
  });
  return zone;
}

// Scales the image to the model's input (from its KServe metadata: [-1, C, H, W], [-1, H, W] or
// [-1, N] for a square of N pixels), sends its raw pixels as UINT8 (C=1: luminance; C=3: RGB
// planes, as CIFAR-10 records them) and reads back the class and its probability.
async function classify(model, file) {
  const name = encodeURIComponent(model);
  const meta = await api(`/v2/models/${name}`);
  const dims = meta.inputs[0].shape.slice(1).map(Number);
  let [c, h, w] = dims.length === 3 ? dims : dims.length === 2 ? [1, ...dims] : [1, 0, 0];
  if (dims.length === 1) {
    h = w = Math.round(Math.sqrt(dims[0]));
  }
  if (!(c === 1 || c === 3) || h * w * c !== dims.reduce((a, b) => a * b, 1)) {
    throw new Error(`${model} takes input [${dims}], which is not an image this page can make`);
  }
  const bitmap = await createImageBitmap(file);
  const canvas = el('canvas', {width: w, height: h});
  const ctx = canvas.getContext('2d', {willReadFrequently: true});
  ctx.imageSmoothingEnabled = bitmap.width !== w || bitmap.height !== h;
  ctx.drawImage(bitmap, 0, 0, w, h);
  const rgba = ctx.getImageData(0, 0, w, h).data;
  const data = new Array(c * h * w);
  for (let i = 0; i < h * w; i++) {
    const [r, g, b] = [rgba[4 * i], rgba[4 * i + 1], rgba[4 * i + 2]];
    if (c === 1)
      data[i] = Math.round(0.299 * r + 0.587 * g + 0.114 * b);
    else {
      data[i] = r;
      data[h * w + i] = g;
      data[2 * h * w + i] = b;
    }
  }
  const answer = await post(`/v2/models/${name}/infer`, {
    inputs: [{name: 'input', shape: [1, ...dims], datatype: 'UINT8', data}],
  });
  const out = (n) => answer.outputs.find((o) => o.name === n).data;
  const cls = out('class')[0];
  return `class ${cls} (${percent(out('probabilities')[cls])})`;
}

// ---- routing -----------------------------------------------------------------------------------

async function route() {
  viewAbort.abort();
  viewAbort = new AbortController();
  const signal = viewAbort.signal;
  showMessage('');
  const parts = (location.hash || '#/jobs').slice(2).split('/');
  for (const a of document.querySelectorAll('nav a'))
    a.classList.toggle('active', a.dataset.view === parts[0]);
  try {
    if (parts[0] === 'jobs' && parts[1])
      await showJob(decodeURIComponent(parts[1]), signal);
    else if (parts[0] === 'compare')
      await showCompare((parts[1] || '').split(',').filter(Boolean), signal);
    else if (parts[0] === 'models')
      await showModels(signal);
    else
      await showJobs(signal);
  } catch (e) {
    reportError(e);
  }
}

$('#forget-token').hidden = !sessionStorage.getItem(TOKEN_KEY);
$('#forget-token').addEventListener('click', () => {
  sessionStorage.removeItem(TOKEN_KEY);
  $('#forget-token').hidden = true;
  route();
});
window.addEventListener('hashchange', route);
route();
