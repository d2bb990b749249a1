#include "server/jobs/event_messages.h"

namespace kiln::server {

v1::StepMetrics StepMetricsOf(const StepEvent& e) {
  v1::StepMetrics m;
  m.set_epoch(e.epoch);
  m.set_step_in_epoch(e.step_in_epoch);
  m.set_steps_per_epoch(e.steps_per_epoch);
  m.set_global_step(e.global_step);
  m.set_loss(e.loss);
  m.set_lr(e.lr);
  m.set_samples_per_sec(e.samples_per_sec);
  return m;
}

v1::EpochMetrics EpochMetricsOf(const EpochEvent& e) {
  v1::EpochMetrics m;
  m.set_epoch(e.epoch);
  m.set_train_loss(e.train_loss);
  m.set_train_accuracy(e.train_accuracy);
  m.set_test_loss(e.test.loss);
  m.set_test_accuracy(e.test.accuracy);
  m.set_test_samples(e.test.samples);
  m.set_train_seconds(e.train_seconds);
  m.set_samples_per_sec(e.samples_per_sec);
  m.set_lr(e.lr);
  return m;
}

StepEvent StepEventOf(const v1::StepMetrics& m) {
  StepEvent e;
  e.epoch = m.epoch();
  e.step_in_epoch = m.step_in_epoch();
  e.steps_per_epoch = m.steps_per_epoch();
  e.global_step = m.global_step();
  e.loss = m.loss();
  e.lr = m.lr();
  e.samples_per_sec = m.samples_per_sec();
  return e;
}

EpochEvent EpochEventOf(const v1::EpochMetrics& m) {
  EpochEvent e;
  e.epoch = m.epoch();
  e.train_loss = m.train_loss();
  e.train_accuracy = m.train_accuracy();
  e.test.loss = m.test_loss();
  e.test.accuracy = m.test_accuracy();
  e.test.samples = m.test_samples();
  e.train_seconds = m.train_seconds();
  e.samples_per_sec = m.samples_per_sec();
  e.lr = m.lr();
  return e;
}

}  // namespace kiln::server
