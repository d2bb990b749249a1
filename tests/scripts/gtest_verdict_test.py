"""scripts/gtest-verdict on made-up GoogleTest logs: the device check must not read an all-skipped
CUDA stage, a crash or a failure as a pass, and must print why."""
import os
import subprocess
import sys
import tempfile
import unittest

VERDICT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gtest-verdict")

HEADER = "Running main() from gtest_main.cc\n[==========] Running 3 tests from 1 test suite.\n"
SKIP = """[ RUN      ] CudaParity.{name}
tests/engine/cuda_parity_test.cc:96: Skipped
no CUDA device found: CUDA driver version is insufficient for CUDA runtime version (the NVIDIA driver is older than this build's CUDA runtime)

[  SKIPPED ] CudaParity.{name} (0 ms)
"""
PASS = "[ RUN      ] CudaParity.{name}\n# cuDNN algorithms: ...\n[       OK ] CudaParity.{name} (12 ms)\n"
FAIL = """[ RUN      ] CudaParity.{name}
tests/engine/cuda_parity_test.cc:170: Failure
Expected: (err) < (tol), actual: 0.00031 vs 5e-05
dw with cuDNN FFT_TILING: relative error 0.00031 over 288 values
[  FAILED  ] CudaParity.{name} (40 ms)
"""
FOOTER = "[==========] 3 tests from 1 test suite ran. (52 ms total)\n[  PASSED  ] 1 test.\n"


def verdict(log, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(log)
    try:
        r = subprocess.run([sys.executable, VERDICT, *flags, f.name], capture_output=True,
                           text=True, timeout=30)
    finally:
        os.unlink(f.name)
    return r.returncode, r.stdout


class GtestVerdict(unittest.TestCase):
    def test_all_passed_is_a_pass(self):
        log = HEADER + PASS.format(name="A") + PASS.format(name="B") + FOOTER
        code, out = verdict(log, "--skips-fail")
        self.assertEqual(code, 0, out)
        self.assertIn("2 passed, 0 failed, 0 skipped", out)

    def test_skips_fail_the_cuda_stage_with_their_reason(self):
        log = HEADER + PASS.format(name="A") + SKIP.format(name="B") + SKIP.format(name="C") + FOOTER
        code, out = verdict(log, "--skips-fail")
        self.assertEqual(code, 1, out)
        self.assertIn("1 passed, 0 failed, 2 skipped", out)
        self.assertIn("skipped tests count as failures", out)
        self.assertIn("2 skipped (CudaParity.B ...)", out)
        self.assertIn("the NVIDIA driver is older than this build's CUDA runtime", out)

    def test_skips_are_allowed_where_not_asked_to_fail(self):
        log = HEADER + PASS.format(name="A") + SKIP.format(name="B") + FOOTER
        code, out = verdict(log)
        self.assertEqual(code, 0, out)

    def test_failures_are_printed_with_their_messages(self):
        log = HEADER + FAIL.format(name="ConvBackward") + PASS.format(name="B") + FOOTER
        code, out = verdict(log, "--skips-fail")
        self.assertEqual(code, 1, out)
        self.assertIn("--- FAILED CudaParity.ConvBackward", out)
        self.assertIn("dw with cuDNN FFT_TILING: relative error 0.00031", out)

    def test_only_the_first_failures_are_printed(self):
        log = HEADER + "".join(FAIL.format(name="F%d" % i) for i in range(4)) + FOOTER
        code, out = verdict(log, "--show", "2")
        self.assertEqual(code, 1, out)
        self.assertIn("CudaParity.F1", out)
        self.assertNotIn("CudaParity.F2", out)
        self.assertIn("and 2 more", out)

    def test_a_run_cut_short_fails_and_names_the_test_it_was_in(self):
        log = HEADER + PASS.format(name="A") + "[ RUN      ] CudaParity.Hangs\n# started\n"
        code, out = verdict(log)
        self.assertEqual(code, 1, out)
        self.assertIn("did not finish", out)
        self.assertIn("--- UNFINISHED CudaParity.Hangs", out)

    def test_an_empty_or_missing_log_fails(self):
        code, out = verdict("")
        self.assertEqual(code, 1, out)
        self.assertIn("no test ran", out)
        r = subprocess.run([sys.executable, VERDICT, "/nonexistent/kiln.log"], capture_output=True,
                           text=True, timeout=30)
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot read", r.stdout)


if __name__ == "__main__":
    unittest.main()
