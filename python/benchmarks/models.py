"""The models the benchmarks train (python/benchmarks/training.py, distributed.py), in bf16 on the GPU with
deterministic weights; FP8 versions come from scalemm.torch.convert_to_float8 (and, for the MoE experts,
Float8GroupedExperts).

    mlp     up, GELU, down (bias-free) at tokens x d x f
    block   a Llama-3-8B-sized transformer block: d 4096, f 14336 (SwiGLU), 32 heads (8 KV heads),
            sequence 2048, batch 4; RMSNorm and attention (SDPA, causal) in bf16
    moe     a DeepSeek-V3-like MoE block: d 7168, 16 experts of f 2048 (SwiGLU), top-4 of 8192 tokens,
            uneven routing; bf16 experts on torch._grouped_mm, FP8 ones in Float8GroupedExperts
"""

from __future__ import annotations

MLP_SHAPES = [(8192, 4096, 14336), (16384, 7168, 2048), (4096, 2048, 8192)]


def build(torch, suite, shape=None):
    """(model, make_input): the model on the CPU in fp32 (move it with .cuda().to(torch.bfloat16)) and a
    function that makes one bf16 input batch on the GPU."""
    import torch.nn.functional as F

    torch.manual_seed(0)
    nn = torch.nn

    if suite == "mlp":
        t, d, f = shape

        class MLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.up = nn.Linear(d, f, bias=False)
                self.down = nn.Linear(f, d, bias=False)

            def forward(self, x):
                return self.down(F.gelu(self.up(x), approximate="tanh"))

        return MLP(), lambda: torch.randn(t, d, device="cuda", dtype=torch.bfloat16)

    if suite == "block":
        d, f, heads, kv, seq, batch = 4096, 14336, 32, 8, 2048, 4
        hd = d // heads

        class GatedMLP(nn.Module):
            def __init__(self):
                super().__init__()
                self.gate, self.up = nn.Linear(d, f, bias=False), nn.Linear(d, f, bias=False)
                self.down = nn.Linear(f, d, bias=False)

            def forward(self, h):
                return self.down(F.silu(self.gate(h)) * self.up(h))

        class Block(nn.Module):
            def __init__(self):
                super().__init__()
                self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
                self.q, self.k = nn.Linear(d, d, bias=False), nn.Linear(d, kv * hd, bias=False)
                self.v, self.o = nn.Linear(d, kv * hd, bias=False), nn.Linear(d, d, bias=False)
                self.mlp = GatedMLP()  # created here: the same initial weights as before it was a module

            def forward(self, x):
                b, s, _ = x.shape
                h = self.n1(x)
                q = self.q(h).view(b, s, heads, hd).transpose(1, 2)
                k = self.k(h).view(b, s, kv, hd).transpose(1, 2)
                v = self.v(h).view(b, s, kv, hd).transpose(1, 2)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
                return x + self.mlp(self.n2(x))

        return Block(), lambda: torch.randn(batch, seq, d, device="cuda", dtype=torch.bfloat16)

    if suite == "moe":
        import scalemm.torch as st

        d, f, experts, topk, tokens = 7168, 2048, 16, 4, 8192

        class BF16Experts(nn.Module):
            def __init__(self, e, i, o):
                super().__init__()
                self.weight = nn.Parameter(torch.randn(e, o, i) / i ** 0.5)

            def forward(self, x, sizes):
                offs = torch.cumsum(sizes, 0).to(torch.int32)
                return torch._grouped_mm(x, self.weight.transpose(-2, -1), offs=offs)

        class MoE(nn.Module):
            def __init__(self):
                super().__init__()
                self.router = nn.Linear(d, experts, bias=False)
                self.w13 = BF16Experts(experts, d, 2 * f)
                self.w2 = BF16Experts(experts, f, d)
                # Uneven routing: a fixed bias towards some experts (about 6x between the most and least used).
                self.register_buffer("skew", torch.linspace(1.5, -1.5, experts))

            def forward(self, x):
                logits = self.router(x).float() + self.skew
                p, e = torch.topk(logits.softmax(-1), topk, dim=-1)
                flat = e.reshape(-1)
                order = torch.argsort(flat, stable=True)
                # Counts without a host synchronisation (torch.bincount reads the maximum on the host).
                sizes = torch.zeros(experts, dtype=torch.int64, device=x.device).scatter_add_(
                    0, flat, torch.ones_like(flat))
                h = x.repeat_interleave(topk, 0).index_select(0, order)  # (T*topk, d) sorted by expert
                g, u = self.w13(h, sizes).chunk(2, dim=-1)
                y = self.w2((F.silu(g) * u).contiguous(), sizes)
                y = y.index_select(0, torch.argsort(order)).view(-1, topk, d)
                return (y * p.unsqueeze(-1).to(y.dtype)).sum(1)

        def to_fp8(m):
            for name in ("w13", "w2"):
                old = getattr(m, name)
                e, o, i = old.weight.shape
                new = st.Float8GroupedExperts(e, i, o, device="cuda", dtype=torch.bfloat16)
                new.weight = old.weight
                setattr(m, name, new)
            return m

        model = MoE()
        model.to_fp8 = to_fp8
        return model, lambda: torch.randn(tokens, d, device="cuda", dtype=torch.bfloat16)
    raise ValueError(suite)
