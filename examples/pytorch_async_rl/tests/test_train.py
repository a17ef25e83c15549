"""A short run of the PyTorch async RL example against a real stitch-node:
the reward improves, no answer violates its constraint, and the summary has
`stitch demo`'s keys."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import unittest

import harness  # noqa: F401  (points STITCH_BIN_DIR at the build tree)

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "..", "train.py")


class ShortRun(unittest.TestCase):
    def run_train(self, *args: str) -> dict:
        done = subprocess.run(
            [sys.executable, TRAIN, "--local", "--json", *args],
            capture_output=True,
            text=True,
            timeout=600,
            env=dict(os.environ),
        )
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        return json.loads(done.stdout.strip().splitlines()[-1])

    def test_reward_improves_with_samples_up_to_two_versions_stale(self):
        summary = self.run_train("--steps", "24", "--staleness", "2")
        for key in ("reward_first", "reward_last", "steps", "samples", "staleness_mean",
                    "staleness_max", "constraint_violations", "pause_ms_max", "publish_ms_mean"):
            self.assertIn(key, summary)
        self.assertEqual(summary["steps"], 24)
        self.assertEqual(summary["samples"], 24 * 16)
        # Every answer's start stamp meets the min_version its request asked
        # for (the trainer's own filter keeps staleness within k; this is the
        # server's guarantee).
        self.assertEqual(summary["constraint_violations"], 0)
        self.assertGreaterEqual(summary["reward_last"], summary["reward_first"] + 0.2, summary)

    def test_on_policy_requests_wait_for_the_newest_version(self):
        # k = 0: every request asks for the version just published; the
        # gateway answers 409 until a replica serves it, and no answer comes
        # from an older one.
        summary = self.run_train("--steps", "4", "--staleness", "0", "--samples", "4")
        self.assertEqual(summary["steps"], 4)
        self.assertEqual(summary["samples"], 16)
        self.assertEqual(summary["constraint_violations"], 0)
