"""Issue 6's table from saved H200 rows: ours (gluon, triton), torch_ref, _scaled_mm, against DeepGEMM.

    python bench/prefill_table.py > bench/results/2026-12-02-h200-prefill.md
Reads the JSON lines `mqa bench --json` wrote and bench/h200_scaled_mm.py's JSON; DeepGEMM's
figures are the ones measured on the same H200 model (issue 6, 2026-12-02, do_bench median).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

R = Path(__file__).parent / "results"
#: (kind, M, N, H) -> (clean=False ms, clean=True TF/s), from issue 6.
DEEPGEMM = {("suffix", 4096, 16384, 32): (0.531, 881), ("suffix", 4096, 16384, 64): (0.967, 988),
            ("causal", 8192, 8192, 32): (0.311, 761), ("causal", 8192, 8192, 64): (0.562, 910),
            ("chunk", 16384, 49152, 32): (6.125, 850), ("chunk", 16384, 49152, 64): (11.127, 971)}


def rows(name: str) -> dict[tuple, dict]:
    out = {}
    for line in (R / name).read_text().splitlines():
        r = json.loads(line)
        out[(r["provider"], r["kind"], r["m"], r["n"], r["h"])] = r
    return out


def torch_ref_ms() -> dict[tuple, float]:
    text = (R / "2026-12-02-h200-prefill-with-torch-ref.log").read_text()
    pat = r"\] (\w+) M=(\d+) N=(\d+) H=(\d+) D=128 torch_ref: ok .*?, ([\d.]+) ms"
    return {(k, int(m), int(n), int(h)): float(ms) for k, m, n, h, ms in re.findall(pat, text)}


def main() -> None:
    clean, noclean = rows("2026-12-02-h200-prefill-clean.jsonl"), rows("2026-12-02-h200-prefill-noclean.jsonl")
    smm_rows = json.loads((R / "2026-12-02-h200-scaled-mm.json").read_text())["rows"]
    smm = {(r["workload"], r["clean"]): r for r in smm_rows}
    ref = torch_ref_ms()
    first = next(iter(clean.values()))
    print(f"# fp8 MQA logits prefill on the H200, {first['date'][:10]}\n")
    print(f"Device {first['device_name']}; versions {json.dumps(first['versions'])}; commit {first['commit']}.")
    print("Median of 30 calls after 5 warm-ups (CUDA events), inputs rotated; TF/s = 2*H*D per valid pair;")
    print("% of the 1979 TF/s datasheet fp8 peak; every result checked first (calc_diff < 1e-3 vs torch_ref")
    print("fp32 on the GPU, -inf mask identical). DeepGEMM figures: issue 6, same H200 model, do_bench median.\n")
    for is_clean, table in ((True, clean), (False, noclean)):
        print(f"## clean_logits={is_clean}\n")
        print("| shape (ks=0) | H | gluon ms | gluon TF/s | % peak | vs DeepGEMM | triton TF/s | vs DeepGEMM "
              "| torch_ref ms | gluon / torch_ref | _scaled_mm TF/s |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for (prov, kind, m, n, h), g in table.items():
            if prov != "gluon":
                continue
            t = table[("triton", kind, m, n, h)]
            dg = DEEPGEMM.get((kind, m, n, h))
            dg_tf = None if dg is None else (dg[1] if is_clean else g["flops"] / (dg[0] * 1e-3) / 1e12)
            vs = lambda r: "-" if dg_tf is None else f"{r['tflops'] / dg_tf:.2f}x"
            tr = ref.get((kind, m, n, h)) if is_clean else None
            s = smm.get((g["workload"], is_clean))
            ref_ms = "-" if tr is None else f"{tr:.1f}"
            ref_x = "-" if tr is None else f"{tr / g['ms_median']:.0f}x"
            smm_tf = "-" if s is None else f"{s['tflops']:.0f}"
            print(f"| {kind} M={m} N={n} | {h} | {g['ms_median']:.3f} | {g['tflops']:.0f} | {g['pct_peak']:.1f}% "
                  f"| {vs(g)} | {t['tflops']:.0f} | {vs(t)} | {ref_ms} | {ref_x} | {smm_tf} |")
        print()


if __name__ == "__main__":
    main()
