"""The built-in engine's forward pass against the same model in PyTorch.

For the same published weights and prompts, the engine's ``return_logprob``
output (per generated token) must equal the PyTorch model's log-softmax within
1e-4 for the float32 presets, and greedy decoding must pick the same tokens.
The bfloat16 preset (medium, ~0.9 GB) is checked within 1e-3 when
``STITCH_TEST_MEDIUM=1`` (both sides widen its weights to float32; the
tolerance covers the longer float32 sums of its larger matrices).

Run: PYTHONPATH=clients/python:clients/python/tests:examples/pytorch_async_rl \
     STITCH_BIN_DIR=build/bin python3 -m unittest discover -s examples/pytorch_async_rl/tests
"""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest

import torch

from harness import Node, init_model
from stitch_client import Client
from stitch_llama import PRESETS, LlamaConfig, LlamaForCausalLM, encode, load_dir

PROMPTS = ["write letters: ", "The quick brown fox", "0", "hello, world! \u00e9\u4e16"]


class Equivalence:
    preset = "tiny"
    tolerance = 1e-4
    max_new_tokens = 24

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        cls.tmp = tempfile.mkdtemp(prefix=f"stitch-equivalence-{cls.preset}-")
        cls.node = Node(os.path.join(cls.tmp, "node"), f"model.preset={cls.preset}")
        cls.client = Client(publisher=cls.node.publisher, gateway=cls.node.gateway)
        boot = os.path.join(cls.tmp, "boot")
        init_model(boot, 11, cls.preset)
        cls.client.publish(boot, run="eq", version=3)
        cls.client.wait_until_serving(3, timeout=300)
        cls.model = load_dir(boot)
        cls.model.eval()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.node.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def engine(self, prompt: str, **sampling):
        params = {"max_new_tokens": self.max_new_tokens, "temperature": 0.0}
        params.update(sampling)
        answer = self.client.generate(
            prompt, sampling_params=params, return_logprob=True, exact_version=3
        )
        meta = answer["meta_info"]
        self.assertEqual(meta["weight_version_start"], 3)
        logprobs = [float(lp[0]) for lp in meta["output_token_logprobs"]]
        tokens = [int(lp[1]) for lp in meta["output_token_logprobs"]]
        self.assertEqual(tokens, answer["output_ids"])
        return tokens, logprobs

    def assert_close(self, ours, theirs, what):
        self.assertEqual(len(ours), len(theirs))
        worst = max((abs(a - b) for a, b in zip(ours, theirs)), default=0.0)
        self.assertLessEqual(worst, self.tolerance, f"{what}: largest logprob difference {worst}")

    def test_greedy_tokens_and_logprobs_match(self):
        for prompt in PROMPTS:
            with self.subTest(prompt=prompt):
                tokens, logprobs = self.engine(prompt)
                self.assertGreater(len(tokens), 0)
                prompt_ids = encode(prompt)
                with torch.no_grad():
                    logits = self.model.forward(prompt_ids + tokens[:-1])[len(prompt_ids) - 1 :]
                    ours = torch.log_softmax(logits.double(), dim=-1)
                # Greedy decoding on the PyTorch side picks, at every position
                # given the same prefix, the token the engine picked: the two
                # generations are the same tokens.
                self.assertEqual(torch.argmax(logits, dim=-1).tolist(), tokens)
                picked = ours.gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
                self.assert_close(picked, logprobs, prompt)

    def test_sampled_logprobs_match_at_the_sampling_temperature(self):
        for seed, temperature in ((1, 1.0), (2, 0.7), (3, 1.6)):
            with self.subTest(seed=seed, temperature=temperature):
                tokens, logprobs = self.engine(
                    "write letters: ", temperature=temperature, sampling_seed=seed
                )
                with torch.no_grad():
                    ours = self.model.token_logprobs(
                        encode("write letters: "), tokens, temperature
                    ).tolist()
                self.assert_close(ours, logprobs, f"T={temperature}")

    def test_a_changed_weight_changes_the_answer_on_both_sides(self):
        # The comparison is not vacuous: a model with one matrix perturbed
        # gives logprobs the engine's do not match.
        prompt_ids = encode("write letters: ")
        tokens, logprobs = self.engine("write letters: ")
        perturbed = load_dir(os.path.join(self.tmp, "boot"))
        with torch.no_grad():
            perturbed.model.layers[0].mlp.down_proj.weight.mul_(1.5)
            ours = perturbed.token_logprobs(prompt_ids, tokens).tolist()
        worst = max(abs(a - b) for a, b in zip(ours, logprobs))
        self.assertGreater(worst, 10 * self.tolerance)


class ServedWithItsOwnConfig(unittest.TestCase):
    """A checkpoint whose config.json says another rope_theta and
    rms_norm_eps (same shapes) is served with them: the engine's logprobs
    follow its config, not the node's preset."""

    def test_logprobs_follow_the_published_config(self):
        tmp = tempfile.mkdtemp(prefix="stitch-equivalence-config-")
        node = Node(os.path.join(tmp, "node"))
        client = Client(publisher=node.publisher, gateway=node.gateway)
        try:
            config = PRESETS["tiny"]
            other = LlamaConfig(**{**config.__dict__, "rope_theta": 500000.0, "rms_norm_eps": 1e-3})
            model = LlamaForCausalLM(other)
            model.init_weights(5)
            client.publish(model.state_dict_for_publish(), run="cfg", version=0,
                           files={"config.json": other.to_json()})
            client.wait_until_serving(0, timeout=60)
            prompt = encode("write letters: ")
            answer = client.generate("write letters: ", return_logprob=True, exact_version=0,
                                     sampling_params={"max_new_tokens": 16, "temperature": 0})
            tokens = answer["output_ids"]
            engine = [lp[0] for lp in answer["meta_info"]["output_token_logprobs"]]
            with torch.no_grad():
                ours = model.token_logprobs(prompt, tokens).tolist()
                default = LlamaForCausalLM(config)
                default.load_state_dict(model.state_dict())
                theirs = default.token_logprobs(prompt, tokens).tolist()
            self.assertLessEqual(max(abs(a - b) for a, b in zip(ours, engine)), 1e-4)
            self.assertGreater(max(abs(a - b) for a, b in zip(theirs, engine)), 1e-3)
        finally:
            client.close()
            node.stop()
            shutil.rmtree(tmp, ignore_errors=True)


class TinyFloat32(Equivalence, unittest.TestCase):
    preset = "tiny"


class SmallFloat32(Equivalence, unittest.TestCase):
    preset = "small"


@unittest.skipUnless(
    os.environ.get("STITCH_TEST_MEDIUM") == "1", "medium (0.9 GB): set STITCH_TEST_MEDIUM=1"
)
class MediumBfloat16(Equivalence, unittest.TestCase):
    preset = "medium"
    tolerance = 1e-3
    max_new_tokens = 8
