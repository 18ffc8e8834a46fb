"""A Flax MLP trained with optax's adamw, its two Dense layers' GEMMs in FP8 through scalemm.jax.

    python examples/train_flax.py                      # blockwise FP8 against bf16, on the default device
    python examples/train_flax.py --recipe mxfp8 --steps 500 --tokens 8192 --width 4096 --hidden 14336

The model regresses a fixed random teacher MLP's outputs; the FP8 run and the bf16 run start from the same
parameters and see the same batches, so their losses are comparable step by step."""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import flax.linen as nn
import optax

import scalemm.jax as sj


class MLP(nn.Module):
    width: int
    hidden: int
    recipe: str | None = None  # None: plain bf16/fp32 Dense
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x):
        dg = {} if self.recipe is None else {"dot_general": sj.fp8_dot_general(self.recipe)}
        h = nn.Dense(self.hidden, dtype=self.dtype, **dg)(x)
        return nn.Dense(self.width, dtype=self.dtype, **dg)(nn.gelu(h))


def train(recipe, *, steps=200, tokens=4096, width=1024, hidden=4096, dtype=jnp.float32, seed=0, lr=1e-3,
          log_every=0):
    """Losses of `steps` adamw steps (recipe None: the same model without FP8)."""
    kx, kt, kp = jax.random.split(jax.random.key(seed), 3)
    teacher = MLP(width, hidden)
    tp = teacher.init(kt, jnp.zeros((1, width)))
    model = MLP(width, hidden, recipe, dtype)
    params = model.init(kp, jnp.zeros((1, width)))
    opt = optax.adamw(lr)
    state = opt.init(params)

    @jax.jit
    def step(params, state, key):
        x = jax.random.normal(key, (tokens, width), jnp.float32)
        y = teacher.apply(tp, x)

        def loss_fn(p):
            return jnp.mean((model.apply(p, x.astype(dtype)).astype(jnp.float32) - y) ** 2)

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, loss

    losses = []
    for i in range(steps):
        params, state, loss = step(params, state, jax.random.fold_in(kx, i))
        losses.append(float(loss))
        if log_every and (i % log_every == 0 or i == steps - 1):
            print(f"  step {i:4d}  loss {losses[-1]:.5f}")
    return losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipe", default="blockwise", choices=list(sj.LINEAR_RECIPES))
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=4096)
    a = ap.parse_args()
    print(f"device: {jax.devices()[0]}")
    out = {}
    for name, recipe in ((a.recipe, a.recipe), ("bf16", None)):
        t = time.perf_counter()
        print(f"{name}:")
        out[name] = train(recipe, steps=a.steps, tokens=a.tokens, width=a.width, hidden=a.hidden,
                          dtype=jnp.bfloat16, log_every=max(1, a.steps // 10))
        print(f"  {time.perf_counter() - t:.1f} s")
    f, b = out[a.recipe][-1], out["bf16"][-1]
    print(f"final loss {a.recipe} {f:.5f}  bf16 {b:.5f}  ({100 * (f - b) / b:+.2f}%)")


if __name__ == "__main__":
    main()
