"""Expert parallelism with FP8 token dispatch: an MoE layer's experts split over the ranks of a process
group, the routed rows quantized once (block1x128, compact scales) on the rank that routes them and sent
in FP8, the m-grouped GEMM run on the received bytes without requantizing, the outputs combined in bf16.

    route(expert_ids, num_experts)              (order, counts): the (token, k) pairs sorted by expert
    plan_dispatch(counts, num_local_experts)    DispatchPlan: the exchange's counts, splits, permutations
    dispatch_fp8(x_sorted, plan)                the FP8 rows (data, scales) the local experts receive
    dispatch_rows / combine_rows                rows to the experts' ranks and back, in their own dtype
    dispatch_grouped(x_sorted, weight, plan)    dispatch + X W_e^T on the local experts (autograd)
    grouped_combine(h, weight, plan)            H W_e^T on the local experts + combine (autograd)
    ExpertParallelExperts                       up, activation, down over the group, both exchanges

What travels (fp8_dispatch=True): each routed row's FP8 bytes and its K/128 fp32 scales, packed into one
uint8 row of K + K/32 bytes, so that one all_to_all_single carries both (one collective's latency, one
set of split sizes; gloo has no FP8 dtypes, hence uint8): 0.516x the bf16 bytes. The dispatch's rows
reach the GEMM as they were quantized: a 1x128 block lies inside one row, so they are the bytes of
quantizing after the exchange. Backward is symmetric: dY is quantized on the rank that holds it and
dispatched in FP8 to the down projection's dgrad; dX goes back in its own dtype (bf16).

wgrad needs X^T (and dY^T) quantized along the tokens of each expert, blocks that span rows of several
source ranks: no sender can make them, and sending them too would cost the bytes saved. They are
rebuilt on the receiving rank from the received rows, dequantized to the activations' dtype and
quantized along the tokens (DeepSeek-V3's dequantize-transpose-requantize): the wgrad operands carry a
second rounding, so weight gradients differ from quantizing bf16 X^T directly within FP8's error
(tests bound it), while the output and dX are bit-identical to the bf16 dispatch.

Split sizes of torch's all_to_all_single are host lists: plan_dispatch reads the send and receive row
counts once (one host synchronisation per layer call, none in backward); every other count stays on the
device. Eager only: that read breaks a torch.compile graph and a CUDA-graph capture.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import _core
from ._autograd import _transpose_fp8
from ._runtime import _NAMES, _name
from .config import _EXPERT_RECIPES
from .experts import _padded_sizes, _quantize_tokens
from .ops import scaled_grouped_mm
from .quantizers import quantize

_ACT, _WGT = _EXPERT_RECIPES["blockwise"]
_FP8 = torch.float8_e4m3fn


@dataclasses.dataclass(frozen=True)
class DispatchPlan:
    """One layer call's exchange: host split sizes (what all_to_all_single takes) and device tensors."""

    group: Optional[object]  # the process group (None: one process, no exchange)
    world: int
    num_local_experts: int
    send_splits: List[int]  # rows this rank sends to each rank (its tokens for that rank's experts)
    recv_splits: List[int]  # rows it receives from each rank
    recv_counts: torch.Tensor  # (world * local,): [r * local + j] rows from rank r for local expert j
    sizes: torch.Tensor  # (local,) int64: the local experts' rows, the m-grouped GEMM's group sizes
    perm: torch.Tensor  # local-expert-major row i is received row perm[i] (expert, then source rank, position)
    inverse: torch.Tensor  # its inverse: the combine's order
    rows: int  # scalemm::quantize::padded_token_rows of the received rows (wgrad's aligned layout)
    padded: torch.Tensor  # the k-grouped wgrad's sizes

    @property
    def tokens(self) -> int:
        """Rows this rank sends: its routed pairs that name an expert."""
        return sum(self.send_splits)

    @property
    def received(self) -> int:
        return sum(self.recv_splits)


def _group_world(group):
    if group is None and not (dist.is_available() and dist.is_initialized()):
        return None, 1
    return group, dist.get_world_size(group)


def route(expert_ids: torch.Tensor, num_experts: int):
    """(order, counts) of (T,) or (T, k) expert ids: order (T k,) the flat pairs sorted by expert, stable
    (token order within an expert), ids outside [0, num_experts) (dropped tokens) sorted last and not
    counted; counts (num_experts,) int64. On the device, no synchronisation."""
    if expert_ids.is_floating_point() or expert_ids.dim() not in (1, 2):
        raise _core.invalid("expert_ids", "integer expert ids per token", "an integer (T,) or (T, k) tensor",
                            f"{expert_ids.dtype} {tuple(expert_ids.shape)}")
    flat = expert_ids.reshape(-1).long()
    key = torch.where((flat >= 0) & (flat < num_experts), flat, num_experts)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=flat.device).scatter_add_(0, key,
                                                                                            torch.ones_like(key))
    return torch.argsort(key, stable=True), counts[:num_experts]


def plan_dispatch(counts: torch.Tensor, num_local_experts: int, group=None) -> DispatchPlan:
    """The exchange of one layer call: counts (world * local,) this rank's rows per global expert (expert
    e on rank e // local), on the device the group communicates from. The counts are exchanged on the
    device (all_to_all_single); the row counts per rank are then read to the host once."""
    group, world = _group_world(group)
    if counts.dim() != 1 or counts.shape[0] != world * num_local_experts or counts.is_floating_point():
        raise _core.invalid("counts", "rows per global expert from this rank",
                            f"an integer ({world * num_local_experts},) tensor ({world} ranks x "
                            f"{num_local_experts} local experts)", f"{counts.dtype} {tuple(counts.shape)}")
    counts = counts.to(torch.int64).contiguous()
    recv_counts = counts
    if world > 1:
        recv_counts = torch.empty_like(counts)
        dist.all_to_all_single(recv_counts, counts, group=group)
    by_rank = torch.stack([counts.view(world, -1).sum(1), recv_counts.view(world, -1).sum(1)])
    send, recv = by_rank.tolist()  # the one host read: all_to_all_single's split sizes are host lists
    total = sum(recv)
    ids = torch.arange(num_local_experts, device=counts.device).repeat(world)
    ids = torch.repeat_interleave(ids, recv_counts, output_size=total)
    perm = torch.argsort(ids, stable=True)
    inverse = torch.empty_like(perm).scatter_(0, perm, torch.arange(total, device=perm.device))
    sizes = recv_counts.view(world, num_local_experts).sum(0)
    rows = (total + 127 * num_local_experts + 127) // 128 * 128
    return DispatchPlan(group, world, num_local_experts, send, recv, recv_counts, sizes, perm, inverse, rows,
                        _padded_sizes(sizes, rows))


def _exchange(t: torch.Tensor, plan: DispatchPlan, to_experts: bool) -> torch.Tensor:
    """t's rows to the experts' ranks (to_experts) or back to the ranks that routed them."""
    send, recv = (plan.send_splits, plan.recv_splits) if to_experts else (plan.recv_splits, plan.send_splits)
    if t.shape[0] != sum(send):
        raise _core.invalid("rows", "one row per routed pair that names an expert", f"{sum(send)} rows",
                            f"{t.shape[0]} rows", "Gather x with the plan's order[:plan.tokens].")
    if plan.world == 1:
        return t
    out = t.new_empty((sum(recv), *t.shape[1:]))
    dist.all_to_all_single(out, t.contiguous(), recv, send, group=plan.group)
    return out


def dispatch_rows(x_sorted: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """x's rows (sorted by global expert) on their experts' ranks, local-expert-major, in x's dtype."""
    return _exchange(x_sorted, plan, True).index_select(0, plan.perm)


def combine_rows(y: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """The local experts' rows back on the ranks that routed them, in those ranks' sorted order."""
    return _exchange(y.index_select(0, plan.inverse), plan, False)


def _quantize_rows(x: torch.Tensor):
    """x rowwise in 1x128 blocks, compact scales (rows, K / 128): each row's bytes depend on that row only."""
    if x.shape[0] == 0:  # a rank that routes nothing: the quantizer refuses empty inputs
        return x.new_empty((0, x.shape[1]), dtype=_FP8), x.new_empty((0, x.shape[1] // 128), dtype=torch.float32)
    return quantize(x.contiguous(), _ACT)


def dispatch_fp8(x_sorted: torch.Tensor, plan: DispatchPlan):
    """(data, scales) of x's rows on their experts' ranks, local-expert-major: quantized here, sent as one
    uint8 row of K data bytes and K / 32 scale bytes each, unpacked there. The bytes of quantizing the
    received bf16 rows."""
    k = x_sorted.shape[1]
    q, s = _quantize_rows(x_sorted)
    packed = torch.cat([q.view(torch.uint8), s.view(torch.uint8)], 1)
    got = _exchange(packed, plan, True).index_select(0, plan.perm)
    return got[:, :k].contiguous().view(_FP8), got[:, k:].contiguous().view(torch.float32)


def _dequantize(q: torch.Tensor, s: torch.Tensor, dtype) -> torch.Tensor:
    n, k = q.shape
    return (q.float().view(n, k // 128, 128) * s.unsqueeze(-1)).view(n, k).to(dtype)


def _columnwise(q, s, plan, dtype):
    """wgrad's operand (T^T along each expert's tokens) rebuilt from received FP8 rows: dequantized to the
    activations' dtype, quantized in the experts' aligned layout."""
    return _quantize_tokens(_dequantize(q, s, dtype), plan.sizes, plan.rows, _ACT)[2:]


def _weight_fp8(weight, dgrad):
    """(W, W^T): W's 128x128 blocks for the forward GEMM, their exact transpose for dgrad (or None)."""
    e, n, k = weight.shape
    wq, ws = quantize(weight.reshape(e * n, k), _WGT)
    wq, ws = wq.view(e, n, k), ws.view(e, n // 128, k // 128)
    return (wq, ws), ((_transpose_fp8(wq), ws.transpose(1, 2).contiguous()) if dgrad else (None, None))


def _out(dt) -> str:
    return _name(dt if dt in _NAMES else torch.bfloat16)


def _mgemm(q, s, wq, ws, plan, dtype):
    return scaled_grouped_mm(q, wq, s, ws, plan.sizes, recipe_a=_ACT, recipe_b=_WGT, out_dtype=_out(dtype))


def _wgrad(dyt, dyts, xt, xts, plan, w_dtype):
    od = w_dtype if w_dtype in _NAMES else torch.float32
    dw = scaled_grouped_mm(dyt, xt, dyts, xts, plan.padded, group_dim="k", recipe_a=_ACT, recipe_b=_ACT,
                           out_dtype=_name(od))
    return dw if dw.dtype == w_dtype else dw.to(w_dtype)


class _DispatchGroupedFn(torch.autograd.Function):
    """Y = dispatch(X) W_e^T on the local experts. fp8: X's rows quantized before the exchange, X^T rebuilt
    from them for wgrad; else X sent in its dtype and quantized after (Float8GroupedExperts' bytes).
    Backward: dY quantized here (rows and aligned dY^T), wgrad, dgrad, dX combined back in its dtype.
    Every rank runs every exchange, also with no rows to send or receive (the collectives must match)."""

    @staticmethod
    def forward(ctx, x, weight, plan, fp8):
        xt = (None, None)
        if fp8:
            q, s = dispatch_fp8(x, plan)
        else:
            xl = dispatch_rows(x, plan)
            q, s, *xt = _quantize_tokens(xl, plan.sizes, plan.rows, _ACT) if plan.received else (None,) * 4
        ctx.plan, ctx.fp8, ctx.dtypes, ctx.weight_shape = plan, fp8, (x.dtype, weight.dtype), weight.shape
        if not plan.received:  # no tokens for this rank's experts
            return x.new_empty((0, weight.shape[1]))
        (wq, ws), wt = _weight_fp8(weight, ctx.needs_input_grad[0])
        y = _mgemm(q, s, wq, ws, plan, x.dtype)
        ctx.save_for_backward(*((q, s) if fp8 and ctx.needs_input_grad[1] else (None, None)), *xt, *wt)
        return y

    @staticmethod
    def backward(ctx, dy):
        plan, (x_dtype, w_dtype) = ctx.plan, ctx.dtypes
        dx = dw = None
        if not plan.received:
            if ctx.needs_input_grad[1]:
                dw = torch.zeros(ctx.weight_shape, dtype=w_dtype, device=dy.device)
            if ctx.needs_input_grad[0]:
                dx = combine_rows(dy.new_empty((0, ctx.weight_shape[2])), plan)
            return dx, dw, None, None
        q, s, xtq, xts, wtq, wts = ctx.saved_tensors
        dyq, dys, dytq, dyts = _quantize_tokens(dy.contiguous(), plan.sizes, plan.rows, _ACT)
        if ctx.needs_input_grad[1]:
            if ctx.fp8:
                xtq, xts = _columnwise(q, s, plan, x_dtype)
            dw = _wgrad(dytq, dyts, xtq, xts, plan, w_dtype)
        del dytq, dyts, xtq, xts
        if ctx.needs_input_grad[0]:
            dx = combine_rows(_mgemm(dyq, dys, wtq, wts, plan, x_dtype), plan)
        return dx, dw, None, None


class _GroupedCombineFn(torch.autograd.Function):
    """combine(H W_e^T): H (the local experts' rows) quantized here as Float8GroupedExperts does, the GEMM,
    its rows sent back in their dtype. Backward: dY quantized on the rank that holds it and dispatched
    (fp8: FP8 rows, dY^T rebuilt from them for wgrad; else in its dtype and quantized after), dgrad on
    the received rows, dH local."""

    @staticmethod
    def forward(ctx, h, weight, plan, fp8):
        ctx.plan, ctx.fp8, ctx.dtypes, ctx.weight_shape = plan, fp8, (h.dtype, weight.dtype), weight.shape
        if not plan.received:
            return combine_rows(h.new_empty((0, weight.shape[1])), plan)
        hq, hs, htq, hts = _quantize_tokens(h.contiguous(), plan.sizes, plan.rows, _ACT)
        (wq, ws), wt = _weight_fp8(weight, ctx.needs_input_grad[0])
        y = _mgemm(hq, hs, wq, ws, plan, h.dtype)
        del hq, hs, wq, ws
        ctx.save_for_backward(htq, hts, *wt)
        return combine_rows(y, plan)

    @staticmethod
    def backward(ctx, dout):
        plan, (h_dtype, w_dtype) = ctx.plan, ctx.dtypes
        dout = dout.to(h_dtype).contiguous()
        if ctx.fp8:
            dyq, dys = dispatch_fp8(dout, plan)
        else:
            dl = dispatch_rows(dout, plan)
        dh = dw = None
        if not plan.received:
            if ctx.needs_input_grad[1]:
                dw = torch.zeros(ctx.weight_shape, dtype=w_dtype, device=dout.device)
            if ctx.needs_input_grad[0]:
                dh = dout.new_empty((0, ctx.weight_shape[2]))
            return dh, dw, None, None
        htq, hts, wtq, wts = ctx.saved_tensors
        if ctx.fp8:
            dytq, dyts = _columnwise(dyq, dys, plan, h_dtype) if ctx.needs_input_grad[1] else (None, None)
        else:
            dyq, dys, dytq, dyts = _quantize_tokens(dl, plan.sizes, plan.rows, _ACT)
        if ctx.needs_input_grad[1]:
            dw = _wgrad(dytq, dyts, htq, hts, plan, w_dtype)
        del dytq, dyts, htq, hts
        if ctx.needs_input_grad[0]:
            dh = _mgemm(dyq, dys, wtq, wts, plan, h_dtype)
        return dh, dw, None, None


def _check_weight(weight, name):
    if weight.dim() != 3 or weight.shape[1] % 128 or weight.shape[2] % 128:
        raise _core.invalid(name, "the local experts' weights in 128x128 blocks",
                            "(local experts, N, K) with N and K multiples of 128", str(tuple(weight.shape)))


def dispatch_grouped(x_sorted: torch.Tensor, weight: torch.Tensor, plan: DispatchPlan, *,
                     fp8_dispatch: bool = True) -> torch.Tensor:
    """x's rows (this rank's pairs sorted by global expert, plan.tokens of them) sent to their experts'
    ranks and multiplied there by the local experts' weight (local, N, K): (plan.received, N) rows,
    local-expert-major. Differentiable in x and weight."""
    _check_weight(weight, "weight")
    return _DispatchGroupedFn.apply(x_sorted, weight, plan, _core.flag(fp8_dispatch, "fp8_dispatch"))


def grouped_combine(h: torch.Tensor, weight: torch.Tensor, plan: DispatchPlan, *,
                    fp8_dispatch: bool = True) -> torch.Tensor:
    """The local experts' rows h (plan.received, K) times their weight (local, N, K), sent back to the
    ranks that routed them: (plan.tokens, N) in those ranks' sorted order. Differentiable in h and weight."""
    _check_weight(weight, "weight")
    return _GroupedCombineFn.apply(h, weight, plan, _core.flag(fp8_dispatch, "fp8_dispatch"))


class ExpertParallelExperts(torch.nn.Module):
    """An MoE layer's experts (up, activation, down) split over a process group: rank r holds experts
    [r L, (r + 1) L), L = num_experts / world. forward(x (T, hidden), expert_ids (T,) or (T, k), weights
    (T, k) optional) -> (T, hidden): out[t] = sum_k w[t, k] expert_{id[t, k]}(x[t]) (w = 1 without
    weights; ids outside [0, num_experts) contribute 0). Each call: route, plan (one host read), dispatch
    (FP8 with fp8_dispatch, else bf16), up GEMM, activation, down GEMM, combine (bf16), all ranks
    together. up_weight (L, intermediate, hidden), down_weight (L, hidden, intermediate): this rank's
    experts. group None: the default group, or one process holding every expert when torch.distributed
    is not initialised."""

    def __init__(self, num_experts: int, hidden_features: int, intermediate_features: int, *, group=None,
                 fp8_dispatch: bool = True, activation: Optional[Callable] = None, device=None, dtype=None):
        super().__init__()
        self.group, world = _group_world(group)
        if num_experts <= 0 or num_experts % world:
            raise _core.invalid("num_experts", "the same number of experts on every rank",
                                f"a positive multiple of the group's {world} ranks", str(num_experts))
        for name, v in (("hidden_features", hidden_features), ("intermediate_features", intermediate_features)):
            if v <= 0 or v % 128:
                raise _core.invalid(name, "128x128 weight blocks", "a positive multiple of 128", str(v),
                                    "Pad the experts to a multiple of 128.")
        local = num_experts // world
        rank = dist.get_rank(self.group) if world > 1 else 0
        self.num_experts, self.num_local_experts, self.first_expert = num_experts, local, rank * local
        self.fp8_dispatch = _core.flag(fp8_dispatch, "fp8_dispatch")
        self.activation = activation or (lambda u: F.gelu(u, approximate="tanh"))
        self.up_weight = torch.nn.Parameter(torch.empty(local, intermediate_features, hidden_features,
                                                        device=device, dtype=dtype))
        self.down_weight = torch.nn.Parameter(torch.empty(local, hidden_features, intermediate_features,
                                                          device=device, dtype=dtype))
        for w in (self.up_weight, self.down_weight):
            bound = 1.0 / w.shape[2] ** 0.5  # nn.Linear's default, per expert
            torch.nn.init.uniform_(w, -bound, bound)

    def forward(self, x: torch.Tensor, expert_ids: torch.Tensor, weights: Optional[torch.Tensor] = None):
        if x.dim() != 2 or x.shape[1] != self.up_weight.shape[2]:
            raise _core.invalid("x", "tokens as rows", f"(T, {self.up_weight.shape[2]})", str(tuple(x.shape)))
        ids = expert_ids if expert_ids.dim() == 2 else expert_ids.reshape(-1, 1)
        if ids.shape[0] != x.shape[0]:
            raise _core.invalid("expert_ids", "k expert ids per token", f"({x.shape[0]},) or ({x.shape[0]}, k)",
                                str(tuple(expert_ids.shape)))
        t, k = ids.shape
        order, counts = route(ids, self.num_experts)
        plan = plan_dispatch(counts, self.num_local_experts, self.group)
        pairs = order[:plan.tokens]
        # Each pair's row through an expanded (T k, hidden) view: its gradient sums k rows without atomics.
        xs = x.unsqueeze(1).expand(t, k, x.shape[1]).reshape(t * k, x.shape[1]).index_select(0, pairs)
        up = dispatch_grouped(xs, self.up_weight, plan, fp8_dispatch=self.fp8_dispatch)
        h = self.activation(up)
        y = grouped_combine(h.to(x.dtype), self.down_weight, plan, fp8_dispatch=self.fp8_dispatch)
        full = y.new_zeros((t * k, y.shape[1])).index_copy(0, pairs, y).view(t, k, -1)
        if weights is None:
            return full[:, 0] if k == 1 else full.float().sum(1).to(x.dtype)
        return (full.float() * weights.float().unsqueeze(-1)).sum(1).to(x.dtype)

    def extra_repr(self):
        return (f"num_experts={self.num_experts}, local={self.num_local_experts} from {self.first_expert}, "
                f"hidden={self.up_weight.shape[2]}, intermediate={self.up_weight.shape[1]}, "
                f"fp8_dispatch={self.fp8_dispatch}")


__all__ = ["DispatchPlan", "route", "plan_dispatch", "dispatch_rows", "combine_rows", "dispatch_fp8",
           "dispatch_grouped", "grouped_combine", "ExpertParallelExperts"]
