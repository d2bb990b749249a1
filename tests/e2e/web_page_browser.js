// The browser half of tests/e2e/web_page_browser.py (read it first):
//   node web_page_browser.js BASE_URL TOKEN IMAGE.png ARTEFACTS_DIR
// Prints "ready" once the page shows its (empty) jobs table, then reads "JOB SECOND_JOB" from
// stdin: the jobs submitted then, which the table must show without a reload. IMAGE.raw beside
// IMAGE.png holds its pixels, for asking kilnd's REST inference directly.
// Drives Debian's chromium through puppeteer-core; prints one JSON line of findings last and
// exits 1 naming the first check that failed.
'use strict';
const fs = require('fs');
const path = require('path');
const puppeteer = require('puppeteer-core');

const [base, token, image, artefacts] = process.argv.slice(2);
let job = null, second = null;

// The next line of stdin.
function readLine() {
  return new Promise((resolve, reject) => {
    let buffer = '';
    const onData = (chunk) => {
      buffer += chunk;
      const end = buffer.indexOf('\n');
      if (end < 0) return;
      process.stdin.off('data', onData);
      process.stdin.pause();
      resolve(buffer.slice(0, end));
    };
    process.stdin.setEncoding('utf8');
    process.stdin.on('data', onData);
    process.stdin.once('end', () => reject(new Error('stdin ended before the job ids came')));
  });
}
const WAIT = {
  timeout: 60000
};

function check(ok, message) {
  if (!ok) throw new Error(message);
}

async function main() {
  const browser = await puppeteer.launch({
    executablePath: process.env.KILN_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    // --no-sandbox: ctest may run as root (CI containers), where chromium's sandbox refuses.
    args: ['--no-sandbox', '--disable-dev-shm-usage', '--disable-gpu'],
  });
  const errors = [];
  let expected = null;
  const page = await browser.newPage();
  try {
    page.on('pageerror', (e) => errors.push('page error: ' + e.message));
    page.on('console', (m) => {
      if (m.type() === 'error') errors.push('console error: ' + m.text());
    });
    await page.setViewport({width: 1280, height: 800});

    // The token prompt, answered as a user would.
    await page.goto(base + '/', {waitUntil: 'domcontentloaded'});
    await page.waitForSelector('#token-dialog[open]', WAIT);
    await page.type('#token-input', token);
    await page.click('#token-form button[type=submit]');
    // These 401s were the prompt's cause, not errors of the page.
    errors.length = 0;

    // The jobs table, empty, then the jobs submitted now appear in it without a reload.
    await page.waitForSelector('#jobs-empty:not([hidden])', WAIT);
    console.log('ready');
    [job, second] = (await readLine()).trim().split(' ');
    await page.waitForSelector(`#jobs tr[data-job-id="${job}"]`, WAIT);
    await page.waitForSelector(`#jobs tr[data-job-id="${second}"]`, WAIT);
    const headers = await page.$$eval('#jobs thead th', (ths) => ths.map((t) => t.textContent));
    for (const h
             of ['JOB', 'NAME', 'OWNER', 'STATE', 'MODEL', 'DATASET', 'DEVICE', 'EPOCHS', 'STEP',
                 'TEST ACC', 'AGE']) {
      check(headers.includes(h), `the jobs table has no ${h} column: ${headers}`);
    }
    // The table follows the job live: its step count grows without a reload.
    const stepOf = () => page.$eval(
        `#jobs tr[data-job-id="${job}"] td:nth-child(11)`, (td) => Number(td.textContent));
    const firstStep = await stepOf();
    await page.waitForFunction((id, s) => {
      const td = document.querySelector(`#jobs tr[data-job-id="${id}"] td:nth-child(11)`);
      return td && Number(td.textContent) > s;
    }, WAIT, job, firstStep);
    await page.screenshot({path: path.join(artefacts, 'jobs-1280.png')});

    // The job's page: the loss curve draws, and points arrive live while the job runs.
    // Clicked in the page: the live table may replace the row between a lookup and a click.
    await page.$eval(`#jobs tr[data-job-id="${job}"] td:nth-child(2)`, (td) => td.click());
    await page.waitForSelector('#loss-chart canvas', WAIT);
    await page.waitForFunction(() => {
      const chart = document.querySelector('#loss-chart');
      const state = document.querySelector('[data-fact="state"]');
      return state && state.textContent === 'RUNNING' && Number(chart.dataset.livePoints) > 0;
    }, WAIT);
    const livePointsWhileRunning =
        await page.$eval('#loss-chart', (c) => Number(c.dataset.livePoints));
    await page.waitForFunction(
        (n) => Number(document.querySelector('#loss-chart').dataset.livePoints) > n, WAIT,
        livePointsWhileRunning);
    await page.screenshot({path: path.join(artefacts, 'job-running-1280.png'), fullPage: true});
    // Checkpoint now, while it runs: the checkpoint shows in the table as on demand.
    await page.$$eval(
        '.actions button', (bs) => bs.find((b) => b.textContent === 'Checkpoint now').click());
    await page.waitForFunction(
        () => [...document.querySelectorAll('#checkpoints tr[data-checkpoint-id] td:nth-child(2)')]
                  .some((td) => td.textContent === 'on_demand'),
        WAIT);
    await page.waitForFunction(
        () => document.querySelector('[data-fact="state"]').textContent === 'SUCCEEDED',
        {timeout: 90000});
    await page.waitForSelector('#checkpoints tr[data-checkpoint-id]', WAIT);
    const points = await page.$eval('#loss-chart', (c) => Number(c.dataset.points));
    check(
        points >= 4 * 64, `the loss curve has ${points} points; 4 epochs of 64 steps were trained`);
    await page.screenshot({path: path.join(artefacts, 'job-1280.png'), fullPage: true});

    // Resume to a fifth epoch from the page: the curve goes on from the job's last step.
    await page.type('input[aria-label="epochs to resume to"]', '5');
    await page.$$eval(
        '.actions button', (bs) => bs.find((b) => b.textContent === 'Resume').click());
    await page.waitForFunction(
        () => Number(document.querySelector('#loss-chart').dataset.points) === 5 * 64 &&
            document.querySelector('[data-fact="state"]').textContent === 'SUCCEEDED',
        {timeout: 90000});
    // Download the newest checkpoint from the page (a fetch with the token, saved as a file):
    // the file is as long as kilnd says the checkpoint is.
    const {checkpoints} = await (await fetch(`${base}/api/jobs/${job}/checkpoints`, {
                            headers: {Authorization: 'Bearer ' + token}
                          })).json();
    const newest = checkpoints[checkpoints.length - 1];
    const downloads = fs.mkdtempSync(path.join(require('os').tmpdir(), 'kiln-web-download-'));
    const cdp = await page.createCDPSession();
    await cdp.send('Browser.setDownloadBehavior', {behavior: 'allow', downloadPath: downloads});
    await page.waitForSelector(`#checkpoints tr[data-checkpoint-id="${newest.id}"] button`, WAIT);
    await page.$eval(`#checkpoints tr[data-checkpoint-id="${newest.id}"] button`, (b) => b.click());
    const saved = path.join(downloads, `${job}-checkpoint-${newest.id}.safetensors`);
    for (let i = 0; i < 600 &&
         !(fs.existsSync(saved) && fs.statSync(saved).size === Number(newest.size_bytes));
         i++) {
      await new Promise((r) => setTimeout(r, 100));
    }
    check(fs.existsSync(saved), `no file ${path.basename(saved)} was downloaded`);
    check(
        fs.statSync(saved).size === Number(newest.size_bytes),
        `the download has ${fs.statSync(saved).size} bytes; the checkpoint ${newest.size_bytes}`);
    fs.rmSync(downloads, {recursive: true, force: true});
    // The same page at 400 px wide: nothing wider than the window but the tables' own scrollers.
    await page.setViewport({width: 400, height: 800});
    await new Promise((r) => setTimeout(r, 300));
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth);
    check(overflow <= 400, `at 400 px the page is ${overflow} px wide`);
    await page.screenshot({path: path.join(artefacts, 'job-400.png'), fullPage: true});
    await page.setViewport({width: 1280, height: 800});

    // Two jobs on one chart, once the second has trained.
    await page.goto(`${base}/#/jobs/${second}`, {waitUntil: 'domcontentloaded'});
    await page.waitForFunction(() => {
      const s = document.querySelector('[data-fact="state"]');
      return s && s.textContent === 'SUCCEEDED';
    }, {timeout: 90000});
    // A plain preset job shows the recipe kilnd resolved from the preset, as `kiln get` does.
    const fact = (k) => page.$eval(`[data-fact="${k}"]`, (d) => d.textContent);
    const optimizer = await fact('optimizer');
    check(optimizer === 'adam lr=0.001 (mnist-cnn\'s)',
          `the preset job's optimizer reads "${optimizer}", not mnist-cnn's Adam at lr 0.001`);
    const precision = await fact('precision');
    check(precision === 'fp32', `the preset job's precision reads "${precision}", not fp32`);
    const batch = await fact('batch size');
    check(batch === '64 (mnist-cnn\'s)', `the preset job's batch size reads "${batch}", not 64`);
    // One epoch: one accuracy point, which the chart must draw (the test series' colour shows
    // on its canvas).
    const drawn = await page.waitForFunction(() => {
      const canvas = document.querySelector('#accuracy-chart canvas');
      if (!canvas) return false;
      const {data} = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height);
      let n = 0;
      for (let i = 0; i < data.length; i += 4) {
        const near = (v, want) => Math.abs(v - want) < 40;
        if (data[i + 3] > 128 && near(data[i], 0xb4) && near(data[i + 1], 0x47) &&
            near(data[i + 2], 0x0c)) {
          n++;
        }
      }
      return n > 0 && n;
    }, {timeout: 10000}).then((h) => h.jsonValue()).catch(() => 0);
    check(drawn > 0, 'the one-epoch job\'s accuracy chart draws no point');
    // Its learning rate is constant at 0.001: the axis ticks around it must read differently.
    await page.waitForFunction(() => {
      const values = JSON.parse(document.querySelector('#lr-chart').dataset.yTicks || '[]')
                         .map(Number);
      return values.length > 0 && Math.min(...values) <= 0.001 && Math.max(...values) >= 0.001;
    }, WAIT);
    const ticks = JSON.parse(await page.$eval('#lr-chart', (c) => c.dataset.yTicks));
    check(ticks.length >= 2 && new Set(ticks).size === ticks.length,
          `the learning-rate axis repeats tick labels: ${ticks.join(', ')}`);
    await page.screenshot({path: path.join(artefacts, 'preset-job-1280.png'), fullPage: true});
    await page.goto(`${base}/#/compare/${job},${second}`, {waitUntil: 'domcontentloaded'});
    await page.waitForSelector('#compare-loss-chart[data-series=\'2\'] canvas', WAIT);
    const legend = await page.$$eval(
        '#compare-loss-chart .u-legend .u-series', (s) => s.map((x) => x.textContent));
    check(
        legend.some((t) => t.includes(job)) && legend.some((t) => t.includes(second)),
        `the comparison's legend does not name both jobs: ${legend}`);
    await page.screenshot({path: path.join(artefacts, 'compare-1280.png'), fullPage: true});

    // Deploy the job's newest checkpoint from its page, then classify an image on Models.
    await page.goto(`${base}/#/jobs/${job}`, {waitUntil: 'domcontentloaded'});
    await page.waitForSelector('#checkpoints tr[data-checkpoint-id] button.deploy', WAIT);
    await page.$eval('#deploy-name', (i) => {
      i.value = 'web-toy';
    });
    await page.$$eval(
        '#checkpoints tr[data-checkpoint-id] button.deploy', (b) => b[b.length - 1].click());
    await page.waitForSelector('#models tr[data-model="web-toy"] input[type=file]', WAIT);
    const input = await page.$('#models tr[data-model="web-toy"] input[type=file]');
    await input.uploadFile(image);
    await page.waitForFunction(() => {
      const r = document.querySelector('#models tr[data-model="web-toy"] .classify-result');
      return r && /^class \d+ /.test(r.textContent);
    }, WAIT);
    const classified =
        await page.$eval('#models tr[data-model="web-toy"] .classify-result', (r) => r.textContent);
    // The request just made shows in the serving numbers at the next refresh.
    await page.waitForFunction(() => {
      const td = document.querySelector('#models tr[data-model="web-toy"] td:nth-child(3)');
      return td && Number(td.textContent) >= 1;
    }, WAIT);
    await page.screenshot({path: path.join(artefacts, 'models-1280.png'), fullPage: true});
    // The class the page showed is the one kilnd's REST inference answers for the same pixels.
    const pixels = [...fs.readFileSync(image.replace(/\.png$/, '.raw'))];
    const side = Math.round(Math.sqrt(pixels.length));
    const res = await fetch(`${base}/v2/models/web-toy/infer`, {
      method: 'POST',
      headers: {Authorization: 'Bearer ' + token, 'Content-Type': 'application/json'},
      body: JSON.stringify(
          {inputs: [{name: 'input', shape: [1, 1, side, side], datatype: 'UINT8', data: pixels}]}),
    });
    check(res.ok, `REST inference answered ${res.status}`);
    expected = (await res.json()).outputs.find((o) => o.name === 'class').data[0];
    check(
        classified.startsWith(`class ${expected} `),
        `the page classified the image as "${classified}"; kilnd's REST inference says ${
            expected}`);
    // The Models and Jobs views at 400 px wide too.
    await page.setViewport({width: 400, height: 800});
    await new Promise((r) => setTimeout(r, 300));
    for (const view of ['models', 'jobs']) {
      if (view === 'jobs') {
        await page.goto(`${base}/#/jobs`, {waitUntil: 'domcontentloaded'});
        await page.waitForSelector(`#jobs tr[data-job-id="${job}"]`, WAIT);
      }
      const width = await page.evaluate(() => document.documentElement.scrollWidth);
      check(width <= 400, `at 400 px the ${view} view is ${width} px wide`);
      await page.screenshot({path: path.join(artefacts, `${view}-400.png`), fullPage: true});
    }
    await page.setViewport({width: 1280, height: 800});
    await page.goto(`${base}/#/models`, {waitUntil: 'domcontentloaded'});
    await page.waitForSelector('#models tr[data-model="web-toy"] button.undeploy', WAIT);
    // Undeploy from the page: the model stays listed, unavailable, as the repository index says.
    await page.$eval('#models tr[data-model="web-toy"] button.undeploy', (b) => b.click());
    await page.waitForFunction(() => {
      const row = document.querySelector('#models tr[data-model="web-toy"]');
      return row && row.textContent.includes('UNAVAILABLE') && !row.textContent.includes('READY');
    }, WAIT);

    check(errors.length === 0, 'JavaScript errors: ' + errors.join('; '));

    // A kilnd built without uPlot (npm unreachable at build time): the page says so where the
    // charts would be, and its script still runs without an error.
    const bare = await browser.newPage();
    const bareErrors = [];
    bare.on('pageerror', (e) => bareErrors.push(e.message));
    // A new tab has its own session storage: the token as the prompt would have kept it.
    await bare.evaluateOnNewDocument((t) => sessionStorage.setItem('kiln-token', t), token);
    await bare.setRequestInterception(true);
    bare.on(
        'request',
        (r) =>
            (r.url().includes('/web/uPlot') ? r.respond({status: 404, body: ''}) : r.continue()));
    await bare.goto(`${base}/#/jobs/${job}`, {waitUntil: 'domcontentloaded'});
    await bare.waitForFunction(() => {
      const note = document.querySelector('#loss-chart .note');
      return note && note.textContent.includes('without uPlot');
    }, WAIT);
    await bare.waitForSelector('#checkpoints tr[data-checkpoint-id]', WAIT);
    check(bareErrors.length === 0, 'JavaScript errors without uPlot: ' + bareErrors.join('; '));
    await bare.close();
    console.log(
        JSON.stringify({live_points: livePointsWhileRunning, points, classified, expected}));
  } catch (e) {
    // What the page showed when a check failed, and what it said.
    await page.screenshot({path: path.join(artefacts, 'failure.png'), fullPage: true})
        .catch(() => {});
    const message = await page.$eval('#message', (m) => m.textContent).catch(() => '');
    throw new Error(
        `${e.message}${message ? ' (the page says: ' + message + ')' : ''}` +
        (errors.length ? '; ' + errors.join('; ') : ''));
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error('FAIL: ' + e.message);
  process.exit(1);
});
