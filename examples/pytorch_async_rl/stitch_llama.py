"""The built-in engine's model in PyTorch: a Llama-architecture decoder with
the same Hugging Face tensor names and config.json, the byte tokenizer (BOS
256, EOS 257), and safetensors directories read and written without any
library beyond PyTorch.

It is written from the architecture (Hugging Face's ``LlamaForCausalLM``:
RMSNorm, rotary embeddings on halves, grouped-query attention, SwiGLU MLP, an
untied output head), not from the engine's C++, so that comparing the two
checks the engine's forward pass against PyTorch's operators.

The mixture-of-experts presets (``moe-tiny``, ``moe-small``) are Hugging
Face's ``Qwen3MoeForCausalLM``: queries and keys RMS-normalized per head before
rotary, and in every layer a sparse block of SwiGLU experts behind a linear
router (``mlp.gate``) that sends each token to its top ``num_experts_per_tok``
experts by softmax score. The forward can replay a given routing (the
``routed_experts`` a rollout returned, R3) instead of routing itself: the
experts are the given ones, their mixing weights still the router's own
scores, so the router keeps its gradient.
"""

from __future__ import annotations

import base64
import json
import math
import os
import struct
from dataclasses import asdict, dataclass
from typing import Dict, List, Mapping, Sequence

import torch
import torch.nn.functional as F

BOS = 256
EOS = 257


@dataclass
class LlamaConfig:
    """The config.json fields the built-in engine reads."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int = 258
    max_position_embeddings: int = 512
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    torch_dtype: str = "float32"
    model_type: str = "llama"
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def is_moe(self) -> bool:
        return self.model_type == "qwen3_moe"

    @classmethod
    def from_json(cls, text: str) -> "LlamaConfig":
        doc = json.loads(text)
        names = cls.__dataclass_fields__.keys()
        return cls(**{k: doc[k] for k in names if k in doc})

    @classmethod
    def from_dir(cls, path: str) -> "LlamaConfig":
        with open(os.path.join(path, "config.json")) as f:
            return cls.from_json(f.read())

    def to_json(self) -> str:
        """A config.json transformers loads as ``LlamaForCausalLM`` or
        ``Qwen3MoeForCausalLM``."""
        doc = asdict(self)
        arch = "Qwen3MoeForCausalLM" if self.is_moe else "LlamaForCausalLM"
        doc.update(architectures=[arch], hidden_act="silu")
        if self.is_moe:
            doc.update(head_dim=self.head_dim, decoder_sparse_step=1, mlp_only_layers=[])
        else:
            for key in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                        "norm_topk_prob"):
                del doc[key]
        doc.update(tie_word_embeddings=False, bos_token_id=BOS, eos_token_id=EOS)
        return json.dumps(doc, indent=2)


#: The engine's presets (`stitch init-model --preset`).
PRESETS: Dict[str, LlamaConfig] = {
    "tiny": LlamaConfig(64, 128, 2, 4, 2, max_position_embeddings=512),
    "small": LlamaConfig(512, 1376, 4, 8, 4, max_position_embeddings=2048),
    "medium": LlamaConfig(
        2048, 5632, 10, 16, 8, max_position_embeddings=4096, torch_dtype="bfloat16"
    ),
    "moe-tiny": LlamaConfig(
        64, 128, 2, 4, 2, max_position_embeddings=512, model_type="qwen3_moe",
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True,
    ),
    "moe-small": LlamaConfig(
        512, 1376, 4, 8, 4, max_position_embeddings=2048, model_type="qwen3_moe",
        num_experts=16, num_experts_per_tok=2, moe_intermediate_size=128, norm_topk_prob=True,
    ),
}


def encode(text: str) -> List[int]:
    """The byte tokenizer: BOS, then one token per UTF-8 byte."""
    return [BOS] + list(text.encode("utf-8"))


class RMSNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(torch.nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        kv = c.num_key_value_heads * c.head_dim
        self.c = c
        self.q_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        self.k_proj = torch.nn.Linear(c.hidden_size, kv, bias=False)
        self.v_proj = torch.nn.Linear(c.hidden_size, kv, bias=False)
        self.o_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False)
        if c.is_moe:
            # Qwen3: per-head RMSNorm of queries and keys, before rotary.
            self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
            self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c = self.c
        n = x.shape[0]
        q = self.q_proj(x).view(n, c.num_attention_heads, c.head_dim).transpose(0, 1)
        k = self.k_proj(x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        v = self.v_proj(x).view(n, c.num_key_value_heads, c.head_dim).transpose(0, 1)
        if c.is_moe:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        group = c.num_attention_heads // c.num_key_value_heads
        k = k.repeat_interleave(group, dim=0)
        v = v.repeat_interleave(group, dim=0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(c.head_dim)
        causal = torch.ones(n, n, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.o_proj(out.transpose(0, 1).reshape(n, c.hidden_size))


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on halves: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class MLP(torch.nn.Module):
    """A SwiGLU MLP: the dense layers' (``intermediate_size``) and each expert's
    (``moe_intermediate_size``)."""

    def __init__(self, c: LlamaConfig, width: int | None = None):
        super().__init__()
        width = c.intermediate_size if width is None else width
        self.gate_proj = torch.nn.Linear(c.hidden_size, width, bias=False)
        self.up_proj = torch.nn.Linear(c.hidden_size, width, bias=False)
        self.down_proj = torch.nn.Linear(width, c.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoE(torch.nn.Module):
    """Qwen3-MoE's sparse block: softmax router scores, the top-k experts of
    each token (or the replayed ones), mixed by their scores (renormalized
    over the chosen with ``norm_topk_prob``)."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.c = c
        self.gate = torch.nn.Linear(c.hidden_size, c.num_experts, bias=False)
        self.experts = torch.nn.ModuleList(
            MLP(c, c.moe_intermediate_size) for _ in range(c.num_experts)
        )

    def forward(self, x: torch.Tensor, replay: torch.Tensor | None = None):
        """(output, own routing, used routing): routings are (tokens, k) ids."""
        c = self.c
        probs = torch.softmax(self.gate(x), dim=-1, dtype=torch.float32)
        _, own = torch.topk(probs, c.num_experts_per_tok, dim=-1)
        used = own if replay is None else replay.to(torch.long)
        weights = probs.gather(1, used)
        if c.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(c.num_experts):
            rows, slot = (used == e).nonzero(as_tuple=True)
            if rows.numel():
                out.index_add_(0, rows, self.experts[e](x[rows]) * weights[rows, slot, None])
        return out, own, used


class Layer(torch.nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = SparseMoE(c) if c.is_moe else MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, replay=None):
        """(hidden, own routing, used routing); the routings are None for a
        dense layer."""
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        if isinstance(self.mlp, SparseMoE):
            out, own, used = self.mlp(self.post_attention_layernorm(x), replay)
            return x + out, own, used
        return x + self.mlp(self.post_attention_layernorm(x)), None, None


class Decoder(torch.nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = torch.nn.ModuleList(Layer(c) for _ in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)


class LlamaForCausalLM(torch.nn.Module):
    """Computes in float32 whatever the stored dtype (as the engine does:
    bfloat16 weights are widened when loaded)."""

    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.config = c
        self.model = Decoder(c)
        self.lm_head = torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False)

    def init_weights(self, seed: int) -> None:
        """Normal(0, 0.02) matrices, unit norms: the engine's initial scale."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    p.copy_(torch.randn(p.shape, generator=g) * 0.02)

    def rope(self, positions: int):
        c = self.config
        half = c.head_dim // 2
        i = torch.arange(half, dtype=torch.float64)
        inv_freq = 1.0 / (c.rope_theta ** (2 * i / c.head_dim))
        angles = torch.arange(positions, dtype=torch.float64)[:, None] * inv_freq[None, :]
        return angles.cos().float(), angles.sin().float()

    def forward(self, tokens: Sequence[int], routing: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (len(tokens), vocab) of one sequence: row i predicts token i + 1.

        For a mixture of experts, ``routing`` (len(tokens), layers, k) replays
        the experts of every position; ``self.own_routing`` and
        ``self.used_routing`` hold, after the call, the router's own top-k and
        the experts used, in the same shape."""
        ids = torch.tensor(list(tokens), dtype=torch.long)
        if routing is not None:
            c = self.config
            want = (len(ids), c.num_hidden_layers, c.num_experts_per_tok)
            if not c.is_moe or tuple(routing.shape) != want:
                raise ValueError(f"routing of shape {tuple(routing.shape)}, expected {want}")
        cos, sin = self.rope(len(ids))
        x = self.model.embed_tokens(ids)
        own, used = [], []
        for i, layer in enumerate(self.model.layers):
            x, o, u = layer(x, cos, sin, None if routing is None else routing[:, i, :])
            own.append(o)
            used.append(u)
        if self.config.is_moe:
            self.own_routing = torch.stack(own, dim=1)
            self.used_routing = torch.stack(used, dim=1)
        return self.lm_head(self.model.norm(x))

    def token_logprobs(
        self,
        prompt: Sequence[int],
        output: Sequence[int],
        temperature: float = 1.0,
        routing: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """log softmax(logits / T) of each output token given what precedes it
        (the engine's ``output_token_logprobs``), computed in float64;
        ``routing`` replays a mixture's experts for every fed position."""
        logits = self.forward(list(prompt) + list(output)[:-1], routing)[len(prompt) - 1 :]
        logp = torch.log_softmax(logits.double() / temperature, dim=-1)
        return logp.gather(1, torch.tensor(list(output))[:, None])[:, 0]

    def state_dict_for_publish(self) -> Dict[str, torch.Tensor]:
        """The weights under their HF names, in the config's dtype."""
        dtype = torch.bfloat16 if self.config.torch_dtype == "bfloat16" else torch.float32
        return {k: v.detach().to(dtype).contiguous() for k, v in self.state_dict().items()}

    def load_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Loads every parameter (widened to float32); a missing or extra
        tensor, or another shape, is an error."""
        own = self.state_dict()
        if set(own) != set(tensors):
            raise ValueError(
                f"tensors differ from the model's: missing {sorted(set(own) - set(tensors))}, "
                f"extra {sorted(set(tensors) - set(own))}"
            )
        self.load_state_dict({k: v.float() for k, v in tensors.items()})


def decode_routed_experts(text: str, layers: int, k: int) -> torch.Tensor:
    """SGLang's ``meta_info["routed_experts"]``: base64 of little-endian int32
    ids, as (fed positions, layers, k)."""
    raw = base64.b64decode(text, validate=True)
    ids = torch.frombuffer(bytearray(raw), dtype=torch.int32)
    return ids.reshape(-1, layers, k).clone()


_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def read_safetensors_dir(path: str) -> Dict[str, torch.Tensor]:
    """Every tensor of the directory's ``.safetensors`` files."""
    out: Dict[str, torch.Tensor] = {}
    for name in sorted(os.listdir(path)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(path, name), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(n))
            data = bytearray(f.read())
        for tensor, spec in header.items():
            if tensor == "__metadata__":
                continue
            if spec["dtype"] not in _DTYPES:
                raise ValueError(f"{name}: tensor {tensor!r} has dtype {spec['dtype']}")
            begin, end = spec["data_offsets"]
            flat = torch.frombuffer(data[begin:end], dtype=_DTYPES[spec["dtype"]])
            out[tensor] = flat.reshape(spec["shape"]).clone()
    return out


def load_dir(path: str) -> LlamaForCausalLM:
    """A model from a Hugging Face directory (config.json + safetensors)."""
    model = LlamaForCausalLM(LlamaConfig.from_dir(path))
    model.load_tensors(read_safetensors_dir(path))
    return model
