"""The built-in presets' model: transformers' Llama (eager attention), written out in torch.

Why not transformers itself: importing it and building its model costs a rank about 3 s of
CPU before the first step (torch alone: 1.5 s), and the suite starts some 160 ranks. This
module is the same network, not a look-alike, and tests/unit/test_llama.py holds it to
transformers' on the same seed: the same parameters under the same names in the same order
(the collectives' flat buffers follow that order), bit for bit; the same logits and
gradients. The seed's draws follow transformers' construction: each module's default torch
initialisation as it is built, then the model body's re-initialisation (normal, std 0.02),
then the head's own, in that order. A folder saved from it is transformers' own format
(to_transformers), so `--preset FOLDER` reads it back through transformers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812 (torch's own spelling)


class Output(NamedTuple):
    """What transformers' forward returns, as far as lossbed reads it (a named tuple, so
    that torch's tree utilities, as DistributedDataParallel uses them, see the tensor)."""
    logits: torch.Tensor


@dataclass(frozen=True)
class LlamaShape:
    """The fields of transformers' LlamaConfig the presets set; the rest at its defaults."""
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    initializer_range: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.to(torch.float32)
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.head_dim = s.head_dim
        self.groups = s.num_attention_heads // s.num_key_value_heads
        self.q_proj = nn.Linear(s.hidden_size, s.num_attention_heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden_size, s.num_key_value_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.num_attention_heads * s.head_dim, s.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask):
        shape = (*x.shape[:-1], -1, self.head_dim)
        q = self.q_proj(x).view(shape).transpose(1, 2)
        k = self.k_proj(x).view(shape).transpose(1, 2)
        v = self.v_proj(x).view(shape).transpose(1, 2)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        if self.groups > 1:
            k = k.repeat_interleave(self.groups, dim=1)
            v = v.repeat_interleave(self.groups, dim=1)
        weights = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5 + mask
        weights = F.softmax(weights, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(weights, v).transpose(1, 2).contiguous()
        return self.o_proj(out.reshape(*x.shape[:-1], -1).contiguous())


class MLP(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.up_proj = nn.Linear(s.hidden_size, s.intermediate_size, bias=False)
        self.down_proj = nn.Linear(s.intermediate_size, s.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = MLP(s)
        self.input_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden_size, s.rms_norm_eps)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    """transformers' LlamaModel: the embedding, the layers and the final norm."""

    def __init__(self, s: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab_size, s.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(s) for _ in range(s.num_hidden_layers))
        self.norm = RMSNorm(s.hidden_size, s.rms_norm_eps)
        inv_freq = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, dtype=torch.float)
                                           / s.head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        _reinitialise(self, s.initializer_range)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        freqs = positions[..., None].float() * self.inv_freq.to(device=x.device)
        angles = torch.cat((freqs, freqs), dim=-1)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        # transformers' eager mask: the dtype's lowest number above the diagonal, added
        length = x.shape[1]
        mask = torch.full((length, length), torch.finfo(x.dtype).min, dtype=x.dtype,
                          device=x.device).triu(1)[None, None]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        return self.norm(x)


class LlamaLM(nn.Module):
    """transformers' LlamaForCausalLM for the presets: model(input_ids=...).logits."""

    def __init__(self, shape: LlamaShape):
        super().__init__()
        self.shape = shape
        self.model = Body(shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        _reinitialise(self.lm_head, shape.initializer_range)

    def forward(self, input_ids: torch.Tensor) -> Output:
        return Output(logits=self.lm_head(self.model(input_ids)))

    def to_transformers(self):
        """The same weights in transformers' LlamaForCausalLM (to save in its format)."""
        from transformers import LlamaConfig, LlamaForCausalLM

        fields = asdict(self.shape)
        theta = fields.pop("rope_theta")
        config = LlamaConfig(tie_word_embeddings=False, attn_implementation="eager",
                             rope_parameters={"rope_type": "default", "rope_theta": theta},
                             **fields)
        with torch.random.fork_rng(devices=[]):  # (its own initial draws: not the caller's)
            model = LlamaForCausalLM(config)
        model.load_state_dict(self.state_dict())
        return model


def _reinitialise(root: nn.Module, std: float) -> None:
    """transformers' _init_weights over `root`'s modules, in their order."""
    with torch.no_grad():
        for module in root.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                module.weight.normal_(0.0, std)
            elif isinstance(module, RMSNorm):
                module.weight.fill_(1.0)
