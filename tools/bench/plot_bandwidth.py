#!/usr/bin/env python3
"""Bar chart of memory-bound kernels against a same-run device-to-device copy.

    python3 tools/bench/plot_bandwidth.py bench_layouts.log bench_emulation.log OUT.png

Reads the tables printed by bench_layouts (columns: case, R, K, MB moved, us, GB/s, copy GB/s, ratio)
and bench_emulation (Markdown: operation, MB r+w, ms, GB/s, memcpy, % of copy), and plots each kernel's
GB/s next to the copy of the same bytes, with the 80% target line.
"""
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def layouts_rows(path):
    rows = []
    for line in open(path):
        m = re.match(r"^(\S.*?\S)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+ok", line)
        if m and float(m.group(4)) >= 7:  # large buffers only: small ones are launch-bound
            rows.append((f"{m.group(1)} {m.group(2)}x{m.group(3)}", float(m.group(6)), float(m.group(7))))
    return rows


def emulation_rows(path):
    rows = []
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 6 and (cells[0].startswith("quantize") or cells[0].startswith("dequantize")):
            try:
                rows.append((cells[0], float(cells[3]), float(cells[4])))
            except ValueError:
                pass
    return rows


def device_name(path):
    """The GPU named on the first line of a bench_layouts/bench_emulation log ("... on NAME (sm_..")."""
    try:
        with open(path) as f:
            m = re.search(r" on (.+?) \(sm_", f.readline())
        return m.group(1) if m else "GPU"
    except OSError:
        return "GPU"


def plot(layouts, emulation, out):
    rows = layouts_rows(layouts) + emulation_rows(emulation)
    fig, ax = plt.subplots(figsize=(12, 0.32 * len(rows) + 1.5))
    names = [r[0] for r in rows]
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r[2] for r in rows], height=0.4, label="D2D copy of the same bytes", color="#bbbbbb")
    ax.barh([i - 0.2 for i in y], [r[1] for r in rows], height=0.4, label="scalemm kernel", color="#1f77b4")
    for i, r in enumerate(rows):
        ax.text(r[1], i - 0.2, f" {100 * r[1] / r[2]:.0f}%", va="center", fontsize=7)
    ax.set_yticks(list(y))
    ax.set_yticklabels(names, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("GB/s (bytes read + written)")
    ax.set_title(f"Layout conversions and quantizers vs a same-run copy ({device_name(layouts)}); "
                 "target: 80% of copy")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    print(f"wrote {out}: {len(rows)} kernels")


def main():
    plot(sys.argv[1], sys.argv[2], sys.argv[3])


if __name__ == "__main__":
    main()
