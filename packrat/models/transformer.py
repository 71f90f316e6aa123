"""BERT-base and GPT-2 small, sharing one attention/MLP layer.

They differ only in where LayerNorm sits (after each residual add in BERT,
before each sublayer in GPT-2), causal masking, and the GELU variant. Both take the
attention mask of padded text (1 on tokens, 0 on padding), so a padded row gives the
answer its text gets alone: BERT is padded on the right, GPT-2 on the left (its
positions count only real tokens, and its next token is read at the last position).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

BERT_VOCAB = 30522
GPT2_VOCAB = 50257


class SelfAttention(nn.Module):
    """Multi-head self-attention with a fused QKV projection."""

    def __init__(self, hidden: int, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        """`allowed`: (b, 1, t, t) or (b, 1, 1, t) booleans, True where a query may read a key."""
        b, t, h = x.shape
        # (b, t, 3h) -> 3 x (b, heads, t, h/heads)
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        return self.out(y.transpose(1, 2).reshape(b, t, h))


class TransformerLayer(nn.Module):
    """Attention + 2-layer GELU MLP, each with a residual; pre- or post-LayerNorm."""

    def __init__(self, hidden: int, heads: int, inner: int, eps: float, *,
                 pre_norm: bool, causal: bool, gelu: str) -> None:
        super().__init__()
        self.pre_norm = pre_norm
        self.attn = SelfAttention(hidden, heads, causal)
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        self.mlp = nn.Sequential(nn.Linear(hidden, inner), nn.GELU(approximate=gelu), nn.Linear(inner, hidden))
        self.norm2 = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        # pre_norm is fixed at construction, so tracing sees only one branch.
        if self.pre_norm:  # GPT-2
            x = x + self.attn(self.norm1(x), allowed)
            return x + self.mlp(self.norm2(x))
        x = self.norm1(x + self.attn(x, allowed))  # BERT
        return self.norm2(x + self.mlp(x))


def _init_weights(module: nn.Module) -> None:
    """N(0, 0.02) weights, zero biases: the usual BERT/GPT-2 initialization."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear):
            nn.init.zeros_(m.bias)


class Bert(nn.Module):
    """Token ids, attention mask and token type ids (batch, seq) -> pooled output
    tanh(W . h_CLS + b), (batch, hidden)."""

    def __init__(self, vocab: int = BERT_VOCAB, hidden: int = 768, layers: int = 12, heads: int = 12,
                 inner: int = 3072, max_positions: int = 512, eps: float = 1e-12) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)
        self.token_types = nn.Embedding(2, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.layers = nn.ModuleList([
            TransformerLayer(hidden, heads, inner, eps, pre_norm=False, causal=False, gelu="none")
            for _ in range(layers)
        ])
        self.pooler = nn.Linear(hidden, hidden)
        _init_weights(self)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]
        x = self.norm(self.tokens(ids) + self.positions.weight[:t] + self.token_types(token_type_ids))
        allowed = attention_mask.bool()[:, None, None, :]  # every query reads the real tokens
        for layer in self.layers:
            x = layer(x, allowed)
        return torch.tanh(self.pooler(x[:, 0]))


class GPT2(nn.Module):
    """Token ids and attention mask (batch, seq), padded on the left -> logits of the token
    after the last one, (batch, vocab)."""

    def __init__(self, vocab: int = GPT2_VOCAB, hidden: int = 768, layers: int = 12, heads: int = 12,
                 max_positions: int = 1024, eps: float = 1e-5) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_positions, hidden)
        self.layers = nn.ModuleList([
            TransformerLayer(hidden, heads, 4 * hidden, eps, pre_norm=True, causal=True, gelu="tanh")
            for _ in range(layers)
        ])
        self.norm = nn.LayerNorm(hidden, eps=eps)
        _init_weights(self)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # the first real token is at 0
        x = self.tokens(ids) + self.positions(positions)
        # A query reads earlier real tokens, and itself: a padding row must read something, or
        # softmax over nothing gives NaN (harmless to real rows, which never read padding).
        # Indices from tensor ops, not from the length: torch.fx traces these, not torch.ones(t, t).
        index = torch.ones_like(ids[0]).cumsum(-1)
        query, key = index[:, None], index[None, :]
        allowed = ((key <= query) & attention_mask.bool()[:, None, None, :]) | (key == query)
        for layer in self.layers:
            x = layer(x, allowed)
        # Only the last position predicts the next token, so only it goes through the
        # output projection, which is tied to the token embedding.
        return F.linear(self.norm(x[:, -1]), self.tokens.weight)


def bert_base() -> Bert:
    return Bert()


def gpt2() -> GPT2:
    return GPT2()
