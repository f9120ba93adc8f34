"""A markdown table of an `ncu --csv --metrics ...` file of scripts/device/ncu_skewed.sh: one row per
kernel of the last forward+backward pass (the first pass compiles), the metrics as columns.
Usage: python scripts/tune/ncu_table.py ncu_32x512.csv"""
import csv
import sys

SHORT = {  # metric -> column
    "gpu__time_duration.sum": "us",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe %",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue active %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "warps active %",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 %",
    "l1tex__throughput.avg.pct_of_peak_sustained_active": "L1 %",
    "dram__bytes.sum": "DRAM MB",
}


def main(path: str) -> None:
    header, kernels = None, {}
    for row in csv.reader(open(path)):
        if row and row[0] == "ID":
            header = row
            continue
        if header and len(row) == len(header):
            r = dict(zip(header, row))
            kernels.setdefault(int(r["ID"]), {"name": r["Kernel Name"]})[r["Metric Name"]] = r["Metric Value"]
    ids = sorted(kernels)
    last = ids[len(ids) // 2:]  # two identical passes: keep the second
    print("| kernel | " + " | ".join(SHORT.values()) + " |")
    print("|---|" + "--:|" * len(SHORT))
    for i in last:
        k = kernels[i]
        vals = []
        for metric, col in SHORT.items():
            v = float(k.get(metric, "nan").replace(",", ""))
            vals.append(f"{v / 1000:.0f}" if col in ("us",) else f"{v / 1e6:.0f}" if col == "DRAM MB" else f"{v:.1f}")
        print(f"| {k['name']} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
