"""The attack's report: worst-case AUROC / FPR95 per method beside its standard and random-sample numbers, the
transfer matrix, and figures of the found examples with the target method's heat map."""

from pathlib import Path

import numpy as np

from segood.io import make_folder


def _cell(value, fmt="{:.3f}"):
    return "–" if value is None else fmt.format(value)


def summary_rows(doc):
    """One row per target: its numbers on the standard set (if any), its network's random set and its own
    worst-case set, and the AUROC drop from the random samples to the worst case."""
    rows = []
    for method, target in doc["targets"].items():
        own = doc["matrix"][method]
        worst, random = own[target["set"]], own[target["random_set"]]
        standard = own.get("standard")
        drop = None if worst["auroc"] is None or random["auroc"] is None else random["auroc"] - worst["auroc"]
        rows.append({"method": method, "network": target["network"], "standard": standard, "random": random,
                     "worst": worst, "auroc_drop": drop, "frames": target["frames"],
                     "mean_score_start": target["mean_score_start"], "mean_score_found": target["mean_score_found"]})
    return rows


def markdown(doc):
    """The report (attack.md): the summary table, the transfer matrices (AUROC, FPR95) and the settings."""
    c = doc["config"]
    lines = [f"# Worst-case OOD: {len(doc['targets'])} methods, {doc['frames']} frames, budget {c['budget']} "
             f"passes per frame, T = {c['temperature']}, step {c['step']}, seed {c['seed']}", "",
             "AUROC ↑ and FPR95 ↓ pooled over pixels. *standard*: the standard set given (`--standard`); *random*: "
             "one sample of the search space per frame, drawn without search (each chain's start); *worst*: the "
             "method's own worst-case set. Δ = random − worst AUROC.", "",
             "| method | network | standard AUROC | random AUROC | worst AUROC | Δ | standard FPR95 | random FPR95 "
             "| worst FPR95 |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in summary_rows(doc):
        s = r["standard"] or {}
        lines.append(f"| {r['method']} | {r['network']} | {_cell(s.get('auroc'))} | {_cell(r['random']['auroc'])} | "
                     f"{_cell(r['worst']['auroc'])} | {_cell(r['auroc_drop'])} | {_cell(s.get('fpr95'))} | "
                     f"{_cell(r['random']['fpr95'])} | {_cell(r['worst']['fpr95'])} |")
    methods = list(doc["targets"])
    for metric, label in (("auroc", "AUROC ↑"), ("fpr95", "FPR95 ↓")):
        lines += ["", f"## Transfer matrix, {label}: rows the worst-case set of the method named, columns the "
                      "method evaluated (the diagonal is each method's own worst case)", "",
                  "| set \\ method | " + " | ".join(methods) + " |", "|---|" + "---:|" * len(methods)]
        for attacked in methods:
            name = doc["targets"][attacked]["set"]
            lines.append(f"| worst {attacked} | " + " | ".join(
                _cell(doc["matrix"][m].get(name, {}).get(metric)) for m in methods) + " |")
    lines += ["", "Zero-inlier thresholds (weakest inlier: lowest per-frame mean max-softmax over the ID pixels of "
                  "the clean frames): " + ", ".join(f"{n} {v['weakest_inlier']:.4f}"
                                                   for n, v in doc["networks"].items()), "",
              f"Network passes: {doc['passes']} in the searches (and {doc.get('reused', 0)} proposals that rendered "
              f"the state's image again, scored without one); search time {doc['search_seconds']:.0f} s, "
              f"evaluation {doc['evaluation_seconds']:.0f} s.", ""]
    return "\n".join(lines)


def example_figure(path, model, method, set_path, *, count=4, mc_seed=0):
    """Up to ``count`` frames of a worst-case set: the image with the pasted region outlined, and the method's
    score map (its heat map, colour range from the frame's ID pixels' 1st to 99th percentile)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch

    from segood.data.h5 import H5SegmentationDataset
    from segood.methods.schedule import score_batch
    from segood.models.network import device_of, preprocess

    dataset = H5SegmentationDataset(set_path)
    count = min(count, len(dataset))
    device = device_of(model)
    fig, axes = plt.subplots(2, count, figsize=(3.2 * count, 3.4), squeeze=False)
    for k in range(count):
        item = dataset[k]
        with torch.no_grad():
            score = score_batch(model, preprocess(item["image"][None].to(device)), [method],
                                mc_seeds=[mc_seed]).scores[0][0].float().cpu().numpy()
        region = item["ood_mask"].numpy() == 1
        lo, hi = np.percentile(score[~region], [1, 99]) if (~region).any() else (score.min(), score.max())
        axes[0, k].imshow(item["image"].permute(1, 2, 0).numpy())
        axes[0, k].contour(region, levels=[0.5], colors="red", linewidths=0.8)
        axes[1, k].imshow(score, cmap="magma", vmin=lo, vmax=hi)
        axes[1, k].contour(region, levels=[0.5], colors="cyan", linewidths=0.6)
        axes[0, k].set_title(f"region mean {score[region].mean():.3g}", fontsize=8)
        for ax in axes[:, k]:
            ax.set_axis_off()
    fig.suptitle(f"{method.name}: worst-case objects (top) and its score (bottom, higher = more OOD)", fontsize=9)
    fig.tight_layout()
    make_folder(Path(path).parent)
    fig.savefig(path, dpi=90)
    plt.close(fig)
