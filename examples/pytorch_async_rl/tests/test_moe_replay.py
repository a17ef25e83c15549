"""MoE routing replay (R3) against the built-in engine's mixture of experts.

The engine answers ``return_routed_experts`` with the experts every fed
position was routed to, in SGLang's shape (``meta_info["routed_experts"]``:
base64 of little-endian int32, (prompt + completion - 1, layers, k)). The
PyTorch model of the same ``moe-tiny`` weights, replaying that routing, must
give the engine's per-token logprobs within 1e-4. A constructed near-tie — two
experts' router scores equal but for float rounding at one position — shows
that without replay the trainer's own routing can differ from the rollout's
(and its logprobs with it), and that replay removes the difference.

Run: PYTHONPATH=clients/python:clients/python/tests:examples/pytorch_async_rl \\
     STITCH_BIN_DIR=build/bin python3 -m unittest discover -s examples/pytorch_async_rl/tests
"""

from __future__ import annotations

import os
import shutil
import tempfile
import unittest

import torch

from harness import Node
from stitch_client import Client
from stitch_llama import PRESETS, LlamaForCausalLM, decode_routed_experts, encode

CONFIG = PRESETS["moe-tiny"]
TOLERANCE = 1e-4
PROMPTS = ["write letters: ", "mixture of experts", "0"]


class MoeReplay(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(max(1, os.cpu_count() or 1))
        cls.tmp = tempfile.mkdtemp(prefix="stitch-moe-replay-")
        cls.node = Node(os.path.join(cls.tmp, "node"), "model.preset=moe-tiny")
        cls.client = Client(publisher=cls.node.publisher, gateway=cls.node.gateway)
        cls.version = 0

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.node.stop()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def publish(self, model: LlamaForCausalLM) -> int:
        """Publishes the model's weights as the next version; waits until served."""
        v = type(self).version
        type(self).version += 1
        self.client.publish(model.state_dict_for_publish(), run="moe", version=v,
                            files={"config.json": CONFIG.to_json()})
        self.client.wait_until_serving(v, timeout=120)
        return v

    def engine(self, prompt: str, version: int, **sampling):
        params = {"max_new_tokens": 12, "temperature": 0.0}
        params.update(sampling)
        answer = self.client.generate(prompt, sampling_params=params, return_logprob=True,
                                      return_routed_experts=True, exact_version=version)
        meta = answer["meta_info"]
        tokens = answer["output_ids"]
        logprobs = [float(lp[0]) for lp in meta["output_token_logprobs"]]
        routing = decode_routed_experts(meta["routed_experts"], CONFIG.num_hidden_layers,
                                        CONFIG.num_experts_per_tok)
        self.assertEqual(routing.shape[0], len(encode(prompt)) + len(tokens) - 1)
        spans = meta["routed_experts_version_spans"]
        self.assertEqual(spans, [{"version": version, "first_row": 0,
                                  "last_row": routing.shape[0] - 1}])
        return tokens, logprobs, routing

    def worst(self, a, b) -> float:
        self.assertEqual(len(a), len(b))
        return max((abs(x - y) for x, y in zip(a, b)), default=0.0)

    def test_replayed_routing_gives_the_engines_logprobs(self):
        model = LlamaForCausalLM(CONFIG)
        model.init_weights(21)
        model.eval()
        v = self.publish(model)
        for prompt in PROMPTS:
            for temperature, seed in ((0.0, 0), (1.0, 4)):
                with self.subTest(prompt=prompt, temperature=temperature):
                    tokens, logprobs, routing = self.engine(
                        prompt, v, temperature=temperature, sampling_seed=seed)
                    self.assertGreater(len(tokens), 0)
                    with torch.no_grad():
                        ours = model.token_logprobs(encode(prompt), tokens,
                                                    temperature or 1.0, routing=routing)
                        used = model.used_routing
                        logits = model.forward(encode(prompt) + tokens[:-1], routing)
                    self.assertLessEqual(self.worst(ours.tolist(), logprobs), TOLERANCE)
                    self.assertTrue(torch.equal(used, routing.long()))
                    if temperature == 0.0:
                        argmax = torch.argmax(logits[len(encode(prompt)) - 1:], dim=-1)
                        self.assertEqual(argmax.tolist(), tokens)
                    # Generic weights have no near-ties: the model's own
                    # router agrees with the engine's everywhere (as sets).
                    own = model.own_routing.sort(dim=-1).values
                    self.assertTrue(torch.equal(own, routing.long().sort(dim=-1).values))

    def test_a_near_tie_routes_differently_without_replay_and_replay_removes_it(self):
        prompt = encode("tie")
        at = len(prompt) - 1  # the position whose logits give the first token
        found = None
        for trial in range(16):
            model = self.near_tie(prompt, at, seed=100 + trial)
            v = self.publish(model)
            tokens, logprobs, routing = self.engine("tie", v)
            with torch.no_grad():
                replayed = model.token_logprobs(prompt, tokens, routing=routing).tolist()
                free = model.token_logprobs(prompt, tokens).tolist()
            own = model.own_routing
            if set(own[at, 0].tolist()) != set(routing[at, 0].tolist()):
                found = (own, routing, replayed, free, logprobs)
                break
        self.assertIsNotNone(found, "no construction put the tie on different sides")
        own, routing, replayed, free, logprobs = found
        # The tie is between experts 1 and 2; expert 0 leads on both sides.
        self.assertEqual(own[at, 0, 0].item(), 0)
        self.assertEqual(routing[at, 0, 0].item(), 0)
        self.assertEqual({own[at, 0, 1].item(), routing[at, 0, 1].item()}, {1, 2})
        self.assertLessEqual(self.worst(replayed, logprobs), TOLERANCE)
        self.assertGreater(self.worst(free, logprobs), 10 * TOLERANCE)

    @staticmethod
    def near_tie(prompt, at, seed) -> LlamaForCausalLM:
        """moe-tiny weights whose layer-0 router, at position ``at`` of
        ``prompt``, scores expert 0 first and experts 1 and 2 equal but for
        float rounding: expert 2's row is expert 1's plus a direction
        orthogonal to that position's router input."""
        model = LlamaForCausalLM(CONFIG)
        model.init_weights(seed)
        model.eval()
        layer = model.model.layers[0]
        with torch.no_grad():
            for e in (1, 2):  # experts that differ enough to move the logits
                for proj in (layer.mlp.experts[e].gate_proj, layer.mlp.experts[e].up_proj,
                             layer.mlp.experts[e].down_proj):
                    proj.weight.mul_(10.0)
            ids = torch.tensor(prompt)
            cos, sin = model.rope(len(ids))
            x = model.model.embed_tokens(ids)
            h = x + layer.self_attn(layer.input_layernorm(x), cos, sin)
            xin = layer.post_attention_layernorm(h)[at].double()
            u = xin / xin.norm()
            g = torch.Generator().manual_seed(seed)
            d = torch.randn(CONFIG.hidden_size, generator=g, dtype=torch.float64)
            d = d - (d @ u) * u
            d = d / d.norm()
            rows = torch.randn(CONFIG.num_experts, CONFIG.hidden_size, generator=g,
                               dtype=torch.float64) * 0.02
            rows -= (rows @ u)[:, None] * u[None, :]
            rows += (-1.0 / xin.norm()) * u[None, :]
            rows[0] = (2.0 / xin.norm()) * u
            rows[1] = (1.0 / xin.norm()) * u
            rows[2] = rows[1] + 0.3 * d
            layer.mlp.gate.weight.copy_(rows.float())
        return model


if __name__ == "__main__":
    unittest.main()
