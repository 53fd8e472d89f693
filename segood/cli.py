"""The ``segood`` command line: ``segood SUBCOMMAND --help`` for each."""

import argparse
import json
import os
import re
import sys

from segood.arguments import device, natural, non_negative_float, positive_float, positive_int
from segood.version import __version__


def _demo(args):
    from segood.demo import COMPONENT_PRESET, component_table, oe_table, run_demo, summary_table

    doc = run_demo(args.out, args.data, seed=args.seed, quick=args.quick, retrain=args.retrain,
                   progress=not args.quiet)
    table = summary_table(doc)
    print(table, end="")
    b = doc["bootstrap"]
    print(f"(lo–hi): {b['confidence']:.0%} image-level bootstrap intervals ({b['resamples']} resamples, seed {b['seed']}).")
    print(f"\nComponent-level metrics (SMIYC, {COMPONENT_PRESET} preset), thresholds committed on the tuning set:\n")
    print(component_table(doc), end="")
    record = doc["outlier_exposure"]["record"]
    print(f"\nOutlier exposure: the plain network fine-tuned with {record['paper']} (λ "
          f"{record['weight']}) on {', '.join(record['object_sources']).upper()} objects pasted onto the train frames, "
          "beside its parent (paired bootstrap on the same resampled images):\n")
    print(oe_table(doc), end="")
    print(f"\n† tuned on the SUN tune split, the same source as the sun test set. ‡ OE objects of the same "
          f"source as the test set's OOD objects (SUN): not unseen objects. Full report: {args.out}/results.md, "
          f"figures in {args.out}/figures/, one run per head in {args.out}/<head>/. {doc['demo_seconds']} s.")
    if "≈" in table:
        print("≈ exact mode may differ from these values by more than 0.01 (its bounds: \"bounds\" in results.json).")
    return 0


def _metrics(args):
    import numpy as np

    from segood.io import atomic_output, output_file, read_npz
    from segood.metrics import METRICS, load_accumulator

    if args.curves:
        output_file(args.curves, ".csv", "the counts", option="--curves")
    arrays = read_npz(args.state, "accumulator or evaluation state")
    if "meta" in arrays:  # an evaluation run's state: one accumulator per method and set
        return _run_metrics(args, arrays)
    acc = load_accumulator(args.state)
    result = acc.compute()
    for name in (*METRICS, "max_iou_threshold", "n_id", "n_ood", "n_ignored"):
        print(f"{name:>18}: {result[name]}")
    if args.curves:
        with atomic_output(args.curves) as tmp:  # (its folder made where missing)
            np.savetxt(tmp, np.column_stack([result[k] for k in ("thresholds", "tp", "fp", "fn", "tn")]),
                       delimiter=",", header="threshold,tp,fp,fn,tn", comments="", fmt=["%.17g"] + ["%d"] * 4)
        print(f"wrote {args.curves}: the counts at each of {len(result['thresholds'])} thresholds")
    return 0


def _run_metrics(args, arrays):
    """``segood metrics RUN/state.npz``: the pooled metrics of every method on every set of an evaluation state, one
    compact table per set (what ``segood evaluate`` prints)."""
    from segood.evaluation.analysis import computed
    from segood.evaluation.report import summary_text
    from segood.evaluation.runner import Evaluation
    from segood.metrics import METRICS

    if args.curves:
        raise ValueError(f"{args.state} is an evaluation state, one accumulator per method and set: --curves writes "
                         "one accumulator's counts; the run's curves are drawn in its figures/ (segood report RUN)")
    ev = Evaluation.from_arrays(arrays, args.state)
    ev.warn_unregistered()
    run = args.state.parent / "run.json"
    try:
        identities = json.loads(run.read_text()).get("sets", {})
    except (OSError, ValueError):  # a state without its run folder: the sets' sources are unknown
        identities = {}
    results = {m: {} for m in ev.method_names}
    for (m, s), r in computed(ev).items():
        per_image, bounds = ((r or {}).get(key) or {} for key in ("per_image_mean", "bounds"))
        results[m][s] = {"pooled": {k: _defined(r.get(k, "nan")) for k in METRICS} if r else {},
                         "per_image_mean": {k: _defined(per_image[k]) for k in METRICS if k in per_image},
                         "bounds": {k: [_defined(v) for v in bounds[k]] for k in METRICS if k in bounds},
                         "n_id": int(r["n_id"]) if r else 0, "n_ood": int(r["n_ood"]) if r else 0}
    sets = {s: {**identities.get(s, {}), "frames": ev.images[s]} for s in ev.set_names}
    print(summary_text({"results": results, "sets": sets}), end="")
    return 0


def _defined(value):
    """A metric's value as a float, None where it is undefined (NaN)."""
    value = float(value)
    return None if value != value else value


def _convert(args):
    import warnings

    from segood.data import convert, mix
    from segood.data.convert import ConversionWarning

    if args.dataset == "coverage":
        from segood.data.h5 import read_manifest
        from segood.data.sun import coverage_markdown

        rows = read_manifest(args.set).get("coverage")
        if not rows:
            raise ValueError(f"{args.set} has no coverage report: only converted SUN sets have one")
        print(coverage_markdown(rows), end="")
        return 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConversionWarning)  # printed below from the manifest, one line each
        if args.dataset == "mix":
            manifest = mix(args.ood, args.id, args.out, seed=args.seed, id_frames=args.id_frames,
                           overwrite=args.overwrite, progress=not args.quiet)
        else:
            from segood.data.h5 import check_output
            from segood.data.registry import get_adapter

            check_output(args.out, overwrite=args.overwrite)  # before listing the raw tree (SUN reads every header)
            adapter = get_adapter(args.dataset).from_args(args)
            manifest = convert(adapter, args.out, size=args.size, workers=args.workers, strict=args.strict,
                               overwrite=args.overwrite, progress=not args.quiet)
    ratio, unused = manifest["id_to_ood_ratio"], manifest.get("unused_files", [])
    if not args.quiet:
        print(f"wrote {args.out}: {manifest['frames']} frames, {len(manifest['skipped'])} skipped; pixels "
              f"{manifest['pixels']}" + (f", ID:OOD = {ratio:.2f}:1" if ratio else ""))
        for entry in manifest["skipped"][:10]:
            print(f"  skipped {entry['frame_id']}: {entry['reason']}")
        if unused:
            print(f"  {len(unused)} files of the raw tree not used (listed in the manifest), e.g. "
                  f"{unused[0]['path']}: {unused[0]['reason']}")
    for message in manifest.get("warnings", ()):
        print(f"segood convert: warning: {message}", file=sys.stderr)
    return 0


def _train(args):
    from dataclasses import fields

    from segood.models.train import NETWORK_KEYS, TrainConfig, finetune_config, train

    names = {f.name for f in fields(TrainConfig)}
    given = {k: v for k, v in vars(args).items() if k in names and v is not None}
    settings = [f"--{k.replace('_', '-')}" for k in NETWORK_KEYS if k in given]
    if args.init_type and settings:
        raise ValueError(f"--init-type {args.init_type} trains the network of the folder --init names: drop "
                         f"{', '.join(settings)}")
    config = finetune_config(**given) if args.init and not args.init_type else TrainConfig(**given)
    log = train(config, resume=args.resume, progress=not args.quiet, stop_after=args.stop_after)
    oe = f" with outlier exposure ({config.oe_loss}) on {config.outlier_exposure}" if config.outlier_exposure else ""
    network = config.init if config.init_type else f"{config.arch}/{config.encoder}/{config.head}"
    if not args.quiet:
        print(f"trained {network}{oe}: {log[-1] if log else 'nothing to do'}; checkpoints in {config.out_dir}")
    return 0


def _miou(args):
    from segood.io import atomic_write_text, output_file
    from segood.models.miou import miou_report

    if args.out:
        output_file(args.out, ".md", "the table (its .csv is written beside it)")
    table, csv = miou_report(args.checkpoints, args.data, batch_size=args.batch_size, progress=not args.quiet)
    if not args.quiet:
        print(table, end="")
    if args.out:
        atomic_write_text(args.out, table)
        atomic_write_text(args.out.with_suffix(".csv"), csv)
        if not args.quiet:
            print(f"wrote {args.out} and {args.out.with_suffix('.csv')}")
    return 0


def _model(args):
    from segood.models import load_model, load_smp_weights

    library = ("model_type", "model", "infer_size", "window", "stride", "class_map")
    if any(getattr(args, name, None) for name in library) or getattr(args, "inference", "whole") != "whole":
        return _library_model(args)
    if args.checkpoint:
        if getattr(args, "align_corners", False):
            raise ValueError("--align-corners sets how a model's smaller logits are resized to the frame; a segood "
                             "checkpoint gives them at the frame's size already: drop it")
        other = _given(args, "arch", "encoder", "weights", "num_classes")
        if other:
            raise ValueError(f"--checkpoint holds its network and its settings: drop {', '.join(other)} (they "
                             "describe a plain smp state dict, given instead of a checkpoint)")
        return load_model(args.checkpoint)[0]
    if args.weights and args.arch and args.encoder:
        model = load_smp_weights(args.arch, args.encoder, args.weights, num_classes=args.num_classes or 19)
        model.align_corners = bool(getattr(args, "align_corners", False))
        return model
    scorer = ", or --scorer MODULE:FUNCTION (scores computed by your own code)" if hasattr(args, "scorer") else ""
    raise ValueError("give the network: --checkpoint (segood's), --arch, --encoder and --weights (a plain smp state "
                     f"dict), or --model-type and --model (another library's){scorer}")


def _library_model(args):
    """A library's network (--model-type, --model and the inference and class-map options)."""
    from segood.models import load_library_model

    if not args.model_type and not args.model:  # (only the options that set up such a network were given)
        given = _given(args, "infer_size", "window", "stride", "class_map") + (
            ["--inference"] if getattr(args, "inference", "whole") != "whole" else [])
        fix = ("a segood checkpoint or an smp state dict takes none: drop them" if args.checkpoint or args.weights
               else "add --model-type and --model")
        raise ValueError(f"{', '.join(given)} set up a library's network (--model-type and --model); {fix}")
    if not args.model_type or not args.model:
        raise ValueError("--model-type and --model go together: the library (hf, torchvision, smp) and the local "
                         "folder or state dict of its network; --inference, --infer-size, --window, --stride and "
                         "--class-map set up such a network")
    other = _given(args, "checkpoint", "encoder", "weights", "num_classes", "align_corners",
                   *(("arch",) if args.model_type != "torchvision" else ()))
    if other:
        raise ValueError(f"--model-type {args.model_type} loads the network from --model: drop {', '.join(other)}")
    options = {"inference": args.inference, "size": args.infer_size, "crop": args.window, "stride": args.stride,
               "classes": _class_map(args.class_map)}
    if args.model_type == "torchvision":
        options["arch"] = args.arch
    return load_library_model(_model_type(args.model_type), args.model, **options)


def _given(args, *names):
    """The options among ``names`` that were given, as flags."""
    return ["--" + name.replace("_", "-") for name in names if getattr(args, name, None)]


def _model_type(spec):
    """The registered model type of ``--model-type`` NAME or MODULE:NAME (the module, which registers NAME with
    ``@register_model_type``, imported first)."""
    from segood.models import MODEL_TYPES
    from segood.registry import import_user_module

    module_name, _, name = spec.rpartition(":")
    if module_name:
        import_user_module(f"--model-type {spec}", module_name)
    if name not in MODEL_TYPES:
        raise ValueError(f"--model-type {spec}: no model type {name!r} is registered (registered: "
                         f"{', '.join(sorted(MODEL_TYPES))}); a loader of your own: MODULE:NAME, where MODULE "
                         "registers NAME with @register_model_type (docs/models.md), or NAME with segood --plugin "
                         "MODULE")
    return name


def _class_map(spec):
    """--class-map: None, 'cityscapes', or a JSON file of a list (network class per target class) or a dict
    {Cityscapes class: network class}."""
    from pathlib import Path

    from segood.labels import NUM_CLASSES

    if spec is None or spec == "cityscapes":
        return spec
    try:
        mapping = json.loads(Path(spec).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"--class-map {spec}: give 'cityscapes' or a readable JSON file of a list or a dict "
                         f"({err})") from None
    if not isinstance(mapping, (list, dict)):
        raise ValueError(f"--class-map {spec} holds {json.dumps(mapping)}: give a JSON list (the network's class per "
                         "Cityscapes trainId) or a dict {Cityscapes class: network class}")
    if isinstance(mapping, list) and len(mapping) != NUM_CLASSES:
        raise ValueError(f"--class-map {spec} lists {len(mapping)} classes: give the network's class for each of the "
                         f"{NUM_CLASSES} Cityscapes trainIds, in their order (or a dict {{Cityscapes class: network "
                         "class})")
    return mapping


def _protocol(args):
    from segood.evaluation.options import ProtocolOptions
    from segood.evaluation.protocol import cross_source

    options = ProtocolOptions.of(rule=args.rule, metric=args.metric, batch_size=args.batch_size, device=args.device,
                                 fit_set=args.fit_set, resume=args.resume, progress=not args.quiet)
    tune, test = sets_by_stem(args.tune_sets, "--tune-sets"), sets_by_stem(args.test_sets, "--test-sets")
    doc = cross_source(_model(args), tune, test, args.methods, args.out, options)
    if not args.quiet:
        print((args.out / "protocol.md").read_text(), end="")
        print(f"\nwrote {args.out}/protocol.json and protocol.md ({len(doc['tuning_sets'])} tuning sets)")
    return 0


def _export(args):
    from segood.evaluation.exchange import export_scores
    from segood.methods import get_method

    sets = sets_by_stem(args.sets, "--sets")
    model = _model(args)
    methods = [get_method(name) for name in args.methods]
    written = export_scores(model, sets, methods, args.out, layout=args.layout, batch_size=args.batch_size,
                            device=args.device, progress=not args.quiet, fit_set=args.fit_set)
    if not args.quiet:
        for (method, set_name), path in written.items():
            print(f"wrote {path}: {method} scores of {set_name}")
    return 0


def _evaluate(args):
    from segood.evaluation import evaluate
    from segood.evaluation.api import start_distributed

    sets = sets_by_stem(args.sets, "--sets")
    device = start_distributed(args.device)
    options = _evaluate_options(args, device, components=_components(args), official=args.official,
                                **_analysis_options(args))
    if args.scorer:
        from segood.methods.scorer import load_scorer

        network = [flag for flag, given in (("--checkpoint", args.checkpoint), ("--arch", args.arch),
                                            ("--weights", args.weights), ("--feature-layer", args.feature_layer),
                                            ("--fit-set", args.fit_set), ("--align-corners", args.align_corners),
                                            ("--model-type", args.model_type),
                                            ("--methods", args.methods != ["all"])) if given]
        if network:
            raise ValueError(f"--scorer returns the anomaly scores itself: drop {', '.join(network)}, which set up "
                             "a network and its methods")
        model, methods = load_scorer(args.scorer, name=args.scorer_name, per_image=args.per_image), None
    elif args.scorer_name or args.per_image:
        raise ValueError("--scorer-name and --per-image describe a scorer: add --scorer MODULE:FUNCTION")
    else:
        model = _model(args)
        methods = None if args.methods == ["all"] else list(args.methods)  # by name: in the form the grid bins
    doc = evaluate(model, sets, methods, args.out, options)
    if doc is not None:
        _print_run(args, args.out, doc)
    return 0


def _components(args):
    """The component-metrics spec of --components, --component-thresholds, --component-rule and
    --oracle-thresholds (None without --components; checked as a whole by
    :func:`segood.evaluation.runner.component_spec`)."""
    from pathlib import Path

    if not args.components:
        if args.component_thresholds or args.component_rule or args.oracle_thresholds:
            raise ValueError("--component-thresholds, --component-rule and --oracle-thresholds set up the component "
                             "metrics: add --components anomaly|obstacle, or drop them")
        return None
    given = args.component_thresholds
    if args.oracle_thresholds and given in (None, "oracle"):
        raise ValueError("--oracle-thresholds says that the thresholds of --component-thresholds FILE.json were "
                         "chosen on the test sets: give the FILE")
    thresholds = None
    if given not in (None, "oracle"):
        try:
            thresholds = json.loads(Path(given).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{given} is not a readable JSON file of thresholds ({err})") from None
    oracle = given == "oracle" or args.oracle_thresholds
    return {"preset": args.components, "thresholds": thresholds, "rule": args.component_rule,
            "source": "oracle" if oracle else "committed"}


def _evaluate_options(args, device, **more):
    """The :class:`~segood.evaluation.options.EvaluateOptions` of ``segood evaluate`` and ``segood robustness``
    (the flags of :func:`add_run_options`, --feature-layer, --no-verify and -q), with ``more``."""
    from segood.evaluation.options import EvaluateOptions

    return EvaluateOptions(batch_size=args.batch_size, device=device, workers=args.workers, amp=args.amp,
                           compile=args.compile, resume=args.resume, save_every=args.save_every,
                           progress=not args.quiet, skip_bad=args.skip_bad, fit_set=args.fit_set,
                           checkpoint=args.checkpoint, feature_layer=args.feature_layer, verify=not args.no_verify,
                           **grid_options(args), **more)


def _print_run(args, folder, doc):
    """A run's report on the terminal: nothing with -q; the full results.md with -v; else one compact table per
    set (:func:`segood.evaluation.report.summary_text`); then what was written where."""
    if args.quiet:
        return
    if args.verbose:
        print((folder / "results.md").read_text())
    else:
        from segood.evaluation.report import summary_text

        print(summary_text(doc))
    print(f"wrote {folder}/: results.md (the full report), results.json, results.csv, results.tex, figures/")


def add_quiet(parser):
    """-q of the commands that write files: no progress bars, and nothing printed but warnings and errors."""
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars; print nothing but warnings and "
                                                                   "errors")


def add_verbosity(parser, *, progress=True):
    """-q and -v of the commands that print a run's report."""
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print nothing but warnings and errors" + (" (no progress bars either)" if progress
                                                                       else ""))
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="print the full report (results.md) instead of one compact table per set")


def _attack(args):
    from segood.attack.options import AttackOptions
    from segood.attack.run import attack
    from segood.attack.search import SearchConfig

    config = SearchConfig(budget=args.budget, temperature=args.temperature, step=args.step, seed=args.seed)
    options = AttackOptions(objects=args.objects, label_map=args.label_map, blend=args.blend,
                            height_ratio=args.height_ratio, config=config, standard=args.standard,
                            fit_set=args.fit_set, max_frames=args.max_frames, resume=args.resume,
                            progress=not args.quiet, figures=not args.no_figures, device=args.device,
                            generator=args.generator)
    attack(args.target, args.frames, args.out, options)
    if not args.quiet:
        print((args.out / "attack.md").read_text(), end="")
        print(f"\nwrote {args.out}/attack.json, attack.md, sets/ (worst_<method>.h5, random_<network>.h5) and eval/"
              + ("" if args.no_figures else ", figures/"))
    return 0


def _attack_generator(args):
    from segood.attack.run import train_generator

    record = train_generator(args.out, objects=args.objects, label_map=args.label_map, latent=args.latent,
                             epochs=args.epochs, seed=args.seed, progress=not args.quiet)
    if not args.quiet:
        print(f"wrote {args.out}: {record['crops']} OOD object crops, latent {args.latent}, {record['epochs']} "
              f"epochs, reconstruction loss {record['loss'][0]:.4f} -> {record['final_loss']:.4f} (mean squared "
              f"error, 0-1 scale), {record['seconds']:.1f} s")
    return 0


def _analysis_options(args):
    from segood.metrics.bootstrap import Bootstrap

    return {"bootstrap": Bootstrap(args.resamples, args.seed) if args.resamples else None,
            "commit_on": args.commit_on}


def add_model_options(parser):
    from pathlib import Path

    from segood.names import INFERENCE_MODES, model_type_names

    parser.add_argument("--checkpoint", type=Path, help="a segood checkpoint")
    parser.add_argument("--arch", help="with --encoder and --weights: a plain smp model and its state dict "
                                       "(any smp architecture name, e.g. pspnet, deeplabv3plus)")
    parser.add_argument("--encoder")
    parser.add_argument("--weights", type=Path)
    parser.add_argument("--num-classes", type=positive_int, metavar="C",
                        help="with --weights: the classes the state dict predicts (default 19, Cityscapes'; with "
                             "others, the methods that need no class mapping run)")
    parser.add_argument("--align-corners", action="store_true",
                        help="with --weights: resize logits that come out smaller than the frame with "
                             "align_corners=True (default: False, as torch; smp's networks give frame-sized logits, "
                             "so it is only recorded)")
    parser.add_argument("--model-type", metavar="|".join(model_type_names()) + "|MODULE:NAME",
                        help="a network of another library, read from --model (docs/models.md): hf (a transformers "
                             "folder), torchvision (a state dict, with --arch), smp (a save_pretrained folder), or "
                             "the loader NAME that MODULE (or a --plugin module) registers")
    parser.add_argument("--model", type=Path, help="with --model-type: the network's local folder or state dict")
    parser.add_argument("--inference", choices=INFERENCE_MODES, default="whole",
                        help="with --model-type: whole frames (default), resize to the network's size and back, "
                             "or a sliding window (--window, --stride)")
    parser.add_argument("--infer-size", type=positive_int, nargs=2, metavar=("H", "W"),
                        help="--inference resize: the network's size (default: its image processor's)")
    parser.add_argument("--window", type=positive_int, nargs=2, metavar=("H", "W"),
                        help="--inference slide: the window (e.g. the training crop)")
    parser.add_argument("--stride", type=positive_int, nargs=2, metavar=("H", "W"),
                        help="--inference slide: the step between windows (default: the window)")
    parser.add_argument("--class-map", metavar="cityscapes|FILE.json",
                        help="with --model-type: map the network's classes to the 19 Cityscapes trainIds, by name "
                             "('cityscapes') or by a JSON list / dict")


def add_run_options(parser):
    """What a run into a folder takes (segood evaluate and segood robustness)."""
    from pathlib import Path

    parser.add_argument("--fit-set", type=Path, help="converted training set to fit Mahalanobis and SML on")
    parser.add_argument("--out", type=Path, required=True, help="run folder, e.g. runs/NAME")
    parser.add_argument("--batch-size", type=positive_int, default=2, help="frames per forward pass (default 2)")
    parser.add_argument("--device", type=device, help="cpu, cuda, cuda:1 (default: the model's)")
    parser.add_argument("--workers", type=natural, help="processes reading frames ahead of the network (default: one "
                        "per spare core, at most 16, none for small sets; 0: read in the main process)")
    parser.add_argument("--amp", choices=("fp16", "bf16"), help="the network's forward passes in mixed precision "
                        "(autocast; the scores are computed from float32 logits)")
    parser.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND", help="the network's forward "
                        "pass through torch.compile (default backend: inductor); the first batches of each frame "
                        "size wait for the compilation")
    add_grid_options(parser)
    parser.add_argument("--save-every", type=positive_int, default=20, help="batches between saved states (default 20)")
    parser.add_argument("--resume", action="store_true", help="continue a killed run from its saved state")
    parser.add_argument("--skip-bad", action="store_true", help="skip unreadable or corrupt frames instead of stopping")


def add_component_options(parser, rules, default):
    """--components, --component-thresholds, --component-rule and --oracle-thresholds (:func:`_components`);
    ``default``: what happens without --component-thresholds."""
    parser.add_argument("--components", choices=("anomaly", "obstacle"),
                        help="also the component-level metrics of SegmentMeIfYouCan with this preset's size filters")
    parser.add_argument("--component-thresholds", metavar="FILE|oracle",
                        help="JSON {method: threshold} chosen on a tuning set (or {method: {set: threshold}}); or "
                             f"'oracle': best pixel F1 on each test set itself, marked ORACLE. {default}")
    parser.add_argument("--component-rule", choices=rules, metavar="RULE",
                        help=f"the rule that picks the thresholds the run chooses itself: {', '.join(rules)} "
                             "(default f1, best pixel F1 as SegmentMeIfYouCan)")
    parser.add_argument("--oracle-thresholds", action="store_true",
                        help="the FILE's thresholds were chosen on the test sets themselves: marked ORACLE in every "
                             "report")


def add_analysis_options(parser):
    parser.add_argument("--commit-on", metavar="SET", help="a set of the run (by name) to commit thresholds on by "
                        "each rule (tpr95, balanced_accuracy, f1, iou), applied unchanged to every set; without it "
                        "the tables show oracle thresholds, named so")
    parser.add_argument("--resamples", type=natural, default=1000, help="image-level bootstrap resamples for the "
                        "intervals and paired comparisons (default 1000; 0: none)")
    parser.add_argument("--seed", type=natural, default=0, help="seed of the bootstrap (default 0)")


def _robustness(args):
    from segood.evaluation.api import start_distributed
    from segood.robustness import resolve_corruptions
    from segood.robustness.suite import robustness

    try:
        corruptions = resolve_corruptions(args.corruptions, args.family)
    except KeyError as err:  # an unknown name: one clear line, like argparse's own errors
        raise ValueError(err.args[0]) from None
    sets = sets_by_stem(args.sets, "--sets")
    options = _evaluate_options(args, start_distributed(args.device))
    model = _model(args)
    methods = None if args.methods == ["all"] else list(args.methods)  # by name: in the form the grid bins
    doc = robustness(model, sets, methods, args.out, corruptions=corruptions,
                     severities=args.severities, seed=args.seed, requirements=args.requirements, family=args.family,
                     standard_size=args.standard_size, reference=args.reference, options=options)
    if doc is None:
        return 0
    if not args.quiet:
        print(f"wrote {args.out}/results.json, results.md and figures/")
    if "approval" in doc:
        if not args.quiet:
            print((args.out / "approval.md").read_text(), end="")
        elif not doc["approval"]["passed"]:
            print(f"segood robustness: the type approval failed ({args.out / 'approval.md'})", file=sys.stderr)
        return 0 if doc["approval"]["passed"] else 1
    return 0


def _approve(args):
    from segood.robustness.approval import load_requirements
    from segood.robustness.suite import is_robustness_run, write_robustness_report

    if not (args.run_dir / "run.json").is_file() or not is_robustness_run(args.run_dir):
        raise ValueError(f"{args.run_dir} is not a run of segood robustness (no run.json naming corruptions); "
                         "approve checks robustness runs: run segood robustness first")
    requirements = load_requirements(args.requirements)  # a refused file changes nothing in the run
    doc = write_robustness_report(args.run_dir, figures=False, requirements=requirements)
    print((args.run_dir / "approval.md").read_text(), end="")
    print(f"\nwrote {args.run_dir}/: approval.md, results.json and results.md")
    return 0 if doc["approval"]["passed"] else 1


def _report(args):
    from segood.evaluation import write_report
    from segood.robustness.suite import is_robustness_run, write_robustness_report

    if args.out and not args.combine:
        raise ValueError(f"--out names the folder of a combined report (--combine RUN ...); {args.run_dir}'s own "
                         "report is rewritten in it: drop --out")
    if args.combine and any(map(is_robustness_run, [args.run_dir, *args.combine])):
        raise ValueError("--combine sets segood evaluate runs side by side; a robustness run is reported on its own "
                         "(segood report RUN)")
    if not args.combine and is_robustness_run(args.run_dir):
        write_robustness_report(args.run_dir)
        if args.verbose and not args.quiet:
            print((args.run_dir / "results.md").read_text())
        if not args.quiet:
            print(f"wrote {args.run_dir}/: results.md (the full report), results.json and figures/")
        return 0
    if args.combine:
        from segood.evaluation import combine_runs

        out = args.out or args.run_dir.with_name(args.run_dir.name + "_combined")
        doc = combine_runs([args.run_dir, *args.combine], out, **_analysis_options(args))
    else:
        doc = write_report(args.run_dir, **_analysis_options(args))
        out = args.run_dir
    _print_run(args, out, doc)
    return 0


def _score(args):
    from segood.evaluation import evaluate_score_maps
    from segood.evaluation.options import ScoreOptions

    options = ScoreOptions(name=args.name, score_range=args.score_range, clip=args.clip, verify=not args.no_verify,
                           official=args.official, components=_components(args), **grid_options(args))
    doc = evaluate_score_maps(args.scores, args.data, args.out, options)
    _print_run(args, args.out, doc)
    return 0


def _submit(args):
    from segood.leaderboard import submit

    if args.run_dir is not None and args.method is None:
        raise ValueError("--method names the run's method to submit")
    doc = submit(args.run_dir, args.out, method=args.method, name=args.method_name, description=args.description,
                 allow_same_source=args.allow_same_source, score_maps=by_set(args.scores, "--scores"),
                 uses_ood_data=args.uses_ood_data, data=by_set(args.data, "--data"))
    print(f"wrote {args.out}: {doc['method']['name']} on {', '.join(doc['sets'])}")
    return 0


def _benchmark(args):
    from segood.leaderboard import make_benchmark

    from segood.metrics import grid_spec

    sets = sets_by_stem(args.sets, "--sets")
    doc = make_benchmark({args.track: {"sets": sets, "rank_by": args.rank_by, "private": args.private or [],
                                       "verified_only": args.verified_only, "components": args.components}}, args.out,
                         grid=grid_spec(args.num_thresholds, None, args.mantissa_bits, kind=args.grid))
    track = doc["tracks"][args.track]
    print(f"wrote {args.out}: track {args.track}, {len(track['sets'])} "
          f"{'set' if len(track['sets']) == 1 else 'sets'}, ranked by {args.rank_by}")
    for name in args.private or ():
        print(f"wrote {args.out.parent / (name + '.public.h5')}: the public copy of {name} (images, no masks)")
    return 0


def _leaderboard(args):
    from segood.leaderboard import leaderboard

    doc = leaderboard(args.submissions, args.benchmark, args.out, work=args.work)
    accepted = sum(len(t["entries"]) for t in doc["tracks"].values())
    print((args.out / "leaderboard.md").read_text(), end="")
    print(f"\n{accepted} {'entry' if accepted == 1 else 'entries'}, {len(doc['rejected'])} rejected; wrote "
          f"{args.out}/: leaderboard.md, leaderboard.json, index.html and figures/ (each entry's ROC curves)")
    return 0


def sets_by_stem(paths, option):
    """{file stem: path} of the sets given to ``option``; sets are named by their stems, so two that share one
    are refused (one would silently replace the other)."""
    sets = {}
    for path in paths:
        if path.stem in sets:
            raise ValueError(f"{option}: {sets[path.stem]} and {path} share the name {path.stem!r} (sets are named by "
                             "their file stems); copy or link one under another name")
        sets[path.stem] = path
    return sets


def by_set(pairs, option):
    """{set name: path} of the SET=PATH values given to ``option``; a set named twice is refused (one would silently
    replace the other)."""
    paths = {}
    for name, path in pairs or ():
        if name in paths:
            raise ValueError(f"{option}: set {name!r} is given twice ({paths[name]} and {path}); give each set once")
        paths[name] = path
    return paths


def set_and_path(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r}: write SET=FILE, e.g. road_anomaly=exports/energy/road_anomaly.h5")
    from pathlib import Path

    return name, Path(path)


def add_grid_options(parser, *, exact=True, scores=False):
    """The threshold grid: the float-order grid by default, the paper's linear grid with --num-thresholds, the
    exact grid with --grid exact or --max-pixels (where ``exact`` offers it)."""
    kinds = ("float", "linear", "exact") if exact else ("float", "linear")
    exact_help = (", exact with --max-pixels); exact: every distinct score a threshold, memory per pixel "
                  "(docs/grids.md)") if exact else ")"
    parser.add_argument("--grid", choices=kinds, help="the threshold grid by name (default: float, linear with "
                        "--num-thresholds" + exact_help)
    parser.add_argument("--mantissa-bits", type=int, metavar="M",
                        help="float-order grid (the default): thresholds 2^-M apart relatively (default 10)")
    where = ("--score-range (or the score file's score_range attribute)" if scores else "[0, 1]")
    parser.add_argument("--num-thresholds", type=int, metavar="T",
                        help=f"the paper's linear grid: T thresholds on {where} (e.g. 400); scores must lie in it")
    if exact:
        parser.add_argument("--max-pixels", type=positive_int, metavar="N",
                            help="exact grid: the most counted pixels each method and set may hold (default 2^28)")


def grid_options(args):
    """The options of :func:`add_grid_options` as keywords of an options object (checked there)."""
    return {"grid": args.grid, "num_thresholds": args.num_thresholds, "mantissa_bits": args.mantissa_bits,
            "max_pixels": args.max_pixels}


def build_parser(*, adapters=True):
    """The whole parser. ``adapters``: the datasets of ``segood convert DATASET`` whose options it holds (which
    imports the dataset adapters, h5py and OpenCV): True every one's, a name that one's, False none (the others
    listed by name only); ``main`` passes the dataset that the command converts, or False."""
    from pathlib import Path

    # Plain name tuples, not the registries: the registries' modules import torch, numba and albumentations.
    from segood.names import (ARCHS, BLENDS, CORRUPTIONS, FAMILIES, HEADS, HEIGHT_RATIO, OE_LOSSES, OFFICIAL,
                              STANDARD_CORRUPTIONS, STANDARD_SIZES, THRESHOLD_RULES, TRAIN_DEFAULTS, adapter_help,
                              method_names, metric_names)

    method_choices, metric_choices = method_names(), metric_names()  # with what a plugin registered

    parser = _Parser(  # (no abbreviations: main reads --plugin before the parser, by its whole name)
        prog="segood", description="segood: pixel-level out-of-distribution detection benchmark for semantic segmentation.",
        allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"segood {__version__}")
    parser.add_argument("--plugin", action="append", metavar="MODULE",
                        help="import MODULE first (repeatable; from the current folder or PYTHONPATH): the methods, "
                             "metrics, dataset adapters and model types it registers join the commands' choices "
                             "(docs/extending.md)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="the whole benchmark on generated data in the real raw layouts")
    demo.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (default runs/demo)")
    demo.add_argument("--data", type=Path, default=Path("datasets/demo"),
                      help="raw trees and sets, cached (default datasets/demo)")
    demo.add_argument("--seed", type=natural, default=0, help="data seed (the shipped checkpoints used 0)")
    demo.add_argument("--retrain", action="store_true", help="train the five demo checkpoints from scratch")
    demo.add_argument("--quick", action="store_true", help="a few small frames (a smoke test, not a benchmark)")
    demo.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(run=_demo)

    metrics = sub.add_parser("metrics", help="print the metrics of a saved accumulator state or of a run's "
                                             "evaluation state (.npz)")
    metrics.add_argument("state", type=Path, help="a file written by an accumulator's save, or a run's state.npz "
                                                  "(every method on every set)")
    metrics.add_argument("--curves", type=Path, help="also write the per-threshold counts to this CSV")
    metrics.set_defaults(run=_metrics)
    convert = sub.add_parser("convert", help="convert a raw dataset once into an HDF5 set (see tools/README.md)")
    kinds = convert.add_subparsers(dest="dataset", required=True, metavar="DATASET")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--out", type=Path, required=True, help="output .h5 (a .manifest.json is written beside)")
    common.add_argument("--size", type=positive_int, nargs=2, metavar=("H", "W"),
                        help="resize every frame to H W (default: each frame keeps its native size; SUN and the "
                             "noise sets: 1024 2048, as the paper); recorded in the manifest's resize")
    common.add_argument("--workers", type=natural, default=0, help="decoding processes (default 0: in-process)")
    common.add_argument("--strict", action="store_true", help="fail on the first frame that cannot be converted")
    common.add_argument("--overwrite", action="store_true", help="replace an existing output")
    add_quiet(common)
    for name, text in adapter_help().items():  # (their options read from the adapter once a dataset is named)
        if adapters is True or adapters == name:
            _add_adapter(kinds.add_parser(name, parents=[common], help=text.replace("%", "%%")), name)
        else:
            kinds.add_parser(name, help=text.replace("%", "%%"))
    mixer = kinds.add_parser("mix", help="OOD set + ID frames (e.g. Cityscapes val) -> an evaluation set")
    mixer.add_argument("--ood", type=Path, required=True)
    mixer.add_argument("--id", type=Path, required=True)
    mixer.add_argument("--id-frames", type=positive_int, help="how many ID frames (default all)")
    mixer.add_argument("--out", type=Path, required=True)
    mixer.add_argument("--seed", type=natural, default=0)
    mixer.add_argument("--overwrite", action="store_true")
    add_quiet(mixer)
    cover = kinds.add_parser("coverage", help="print the label-map audit of a converted SUN set")
    cover.add_argument("set", type=Path)
    convert.set_defaults(run=_convert)

    train = sub.add_parser("train", help="train a segmentation network on a converted set (Cityscapes trainIds)")
    train.add_argument("--train", dest="train_set", required=True, help="converted training set (.h5)")
    train.add_argument("--val", dest="val_set", help="converted validation set: mIoU per epoch")
    train.add_argument("--out", dest="out_dir", required=True, help="folder for last.pt, final.pt and log.csv")
    train.add_argument("--arch", choices=ARCHS, help=f"(default {TRAIN_DEFAULTS['arch']})")
    train.add_argument("--encoder", help="smp encoder (default resnet50; e.g. tu-xception41 for DeepLabV3+)")
    train.add_argument("--head", choices=HEADS, help=f"(default {TRAIN_DEFAULTS['head']})")
    train.add_argument("--encoder-weights", help="e.g. imagenet, when cached locally (default none)")
    for name, kind in (("epochs", natural), ("batch-size", positive_int), ("lr", positive_float),
                       ("poly-power", non_negative_float), ("dropout-p", float), ("reduced-dim", positive_int),
                       ("workers", natural), ("seed", natural)):
        train.add_argument(f"--{name}", type=kind, help=f"(default {TRAIN_DEFAULTS[name.replace('-', '_')]})")
    train.add_argument("--crop", type=positive_int, nargs=2, metavar=("H", "W"),
                       help="training crop (default 512 1024; at most the frames' size times --scale's MAX)")
    train.add_argument("--scale", type=float, nargs=2, metavar=("MIN", "MAX"), help="random scale (default 0.5 2)")
    train.add_argument("--device", type=device, help="cpu, cuda, cuda:1 (default: cuda when available)")
    train.add_argument("--init", help="start from this checkpoint (its network settings; fine-tuning)")
    train.add_argument("--init-type", choices=("hf",), help="hf: --init is a transformers mask-classification "
                       "network's folder (Mask2Former, EoMT), fine-tuned with --oe-loss rba into OUT/final/")
    train.add_argument("--outlier-exposure", metavar="SET",
                       help="fine-tune --init with outlier exposure on the frames of SET (pasted OOD objects, segood "
                            "convert paste) besides --train; test sets whose objects share SET's source are flagged")
    train.add_argument("--oe-loss", choices=OE_LOSSES,
                       help="entropy (Meta-OOD, the default), energy (Liu et al. 2020) or rba (Nayal et al. 2023)")
    train.add_argument("--oe-weight", type=float,
                       help="the OOD term's weight (default: the paper's, entropy λ 0.9, energy 0.1, rba 1)")
    train.add_argument("--oe-margins", type=float, nargs=2, metavar=("M_IN", "M_OUT"),
                       help="hinge margins of energy (default -25 -7) and rba (default 0 5)")
    train.add_argument("--oe-reduction", choices=("sets", "pixels"),
                       help="entropy: each term a mean over its pixels (sets, the paper) or over all (pixels)")
    train.add_argument("--resume", action="store_true", help="continue from OUT/last.pt")
    train.add_argument("--stop-after", type=positive_int,
                       help="stop after this many epochs (resume later with --resume)")
    add_quiet(train)
    train.set_defaults(run=_train)

    miou = sub.add_parser("miou", help="per-class IoU and mIoU of checkpoints on a converted set")
    miou.add_argument("checkpoints", type=Path, nargs="+")
    miou.add_argument("--data", type=Path, required=True)
    miou.add_argument("--out", type=Path, help="write the table here (.md) and a .csv beside it")
    miou.add_argument("--batch-size", type=positive_int, default=2, help="frames per forward pass (default 2)")
    add_quiet(miou)
    miou.set_defaults(run=_miou)

    ev = sub.add_parser("evaluate", help="evaluate OOD methods of a model on converted sets; tables and figures")
    add_model_options(ev)
    ev.add_argument("--feature-layer", help="for external models: the layer Mahalanobis models")
    ev.add_argument("--scorer", metavar="MODULE:FUNCTION",
                    help="evaluate a function that returns anomaly scores itself, imported from the current folder "
                         "or PYTHONPATH: uint8 RGB images (N, 3, H, W) -> scores (N, H, W), higher = more OOD "
                         "(instead of a model and its methods)")
    ev.add_argument("--scorer-name", help="the scorer's name in the tables (default: the function's name)")
    ev.add_argument("--per-image", action="store_true",
                    help="the scorer takes one image at a time as SegmentMeIfYouCan calls a method: a uint8 RGB "
                         "array (H, W, 3) -> scores (H, W)")
    ev.add_argument("--sets", type=Path, nargs="+", required=True, help="converted evaluation sets (.h5)")
    ev.add_argument("--methods", nargs="+", default=["all"], choices=["all", *method_choices], metavar="METHOD",
                    help=f"method names ({', '.join(method_choices)}), or all (default: every method the head serves)")
    add_run_options(ev)
    add_component_options(ev, THRESHOLD_RULES, "Without it, --commit-on SET commits them on SET by best pixel F1 "
                          "(a second pass over the frames)")
    ev.add_argument("--official", choices=OFFICIAL,
                    help="also the benchmark's own computation of its numbers (its AP and FPR95, CAOS' per-image "
                         "AUROC too; SMIYC's component metrics), reported beside segood's as e.g. 'AUPRC (SMIYC "
                         "official)' (docs/official.md)")
    ev.add_argument("--no-verify", action="store_true",
                    help="do not check frames against their set's sha256 digests (faster; corruption goes unseen)")
    add_analysis_options(ev)
    add_verbosity(ev)
    ev.set_defaults(run=_evaluate)

    att = sub.add_parser("attack", help="search each method's worst-case pasted objects (adversarial OOD "
                                        "distributions), write them as sets, and evaluate every method on each")
    att.add_argument("--target", nargs="+", required=True, metavar="METHOD=CHECKPOINT",
                     help="the methods to attack, each with its network, e.g. energy=checkpoints/demo_plain.pt")
    att.add_argument("--frames", type=Path, required=True,
                     help="a converted set of clean ID frames with road or sidewalk (e.g. Cityscapes val)")
    att.add_argument("--out", type=Path, required=True, help="the attack's folder, e.g. runs/attack")
    att.add_argument("--objects", default="demo", help="outlines to paste: a SUN2012 root or 'demo' (default)")
    att.add_argument("--label-map", default="sun", help="which objects are OOD (default label_maps/sun.yaml)")
    att.add_argument("--blend", choices=BLENDS, default="feather", help="default feather")
    att.add_argument("--height-ratio", type=float, nargs=2, default=HEIGHT_RATIO, metavar=("LOW", "HIGH"),
                     help="pasted height / distance of its base below the horizon (default %(default)s)")
    att.add_argument("--budget", type=positive_int, default=100,
                     help="network passes per frame and method (default 100)")
    att.add_argument("--temperature", type=positive_float, default=0.1,
                     help="of the energy in units of the method's ID score spread (default 0.1)")
    att.add_argument("--step", type=positive_float, default=0.1, help="proposal std in the unit cube (default 0.1)")
    att.add_argument("--seed", type=natural, default=0, help="with the frame id and the method, seeds each chain")
    att.add_argument("--max-frames", type=positive_int, help="attack the first N frames only")
    att.add_argument("--standard", type=Path, help="a standard OOD set evaluated beside (e.g. the demo's paste.h5)")
    att.add_argument("--fit-set", type=Path, help="converted training set to fit sml and mahalanobis on")
    att.add_argument("--device", type=device, help="cpu, cuda (default: cpu)")
    att.add_argument("--resume", action="store_true", help="continue a killed attack from its per-frame states")
    att.add_argument("--generator", type=Path,
                     help="a generator (segood attack-generator): adds the 'learned' fill and its latent dimensions")
    att.add_argument("--no-figures", action="store_true")
    add_quiet(att)
    att.set_defaults(run=_attack)

    gen = sub.add_parser("attack-generator", help="train the attack's learned fill: a small autoencoder over the "
                                                  "OOD object crops of the paste bank (its decoder is searched)")
    gen.add_argument("--out", type=Path, required=True, help="the generator file, e.g. runs/generator.pt")
    gen.add_argument("--objects", default="demo", help="the objects to learn: a SUN2012 root or 'demo' (default)")
    gen.add_argument("--label-map", default="sun", help="which objects are OOD (default label_maps/sun.yaml)")
    gen.add_argument("--latent", type=positive_int, default=16, help="latent size (default 16)")
    gen.add_argument("--epochs", type=positive_int, default=200, help="passes over the crops (default 200)")
    gen.add_argument("--seed", type=natural, default=0, help="seeds the weights and the batch order")
    add_quiet(gen)
    gen.set_defaults(run=_attack_generator)

    proto = sub.add_parser("protocol", help="the cross-source protocol: tune and commit thresholds on each tuning "
                                            "set, test on every test set; a matrix per method and its headline")
    add_model_options(proto)
    proto.add_argument("--tune-sets", type=Path, nargs="+", required=True, help="converted tuning sets, one per source")
    proto.add_argument("--test-sets", type=Path, nargs="+", required=True, help="converted test sets")
    proto.add_argument("--methods", nargs="+", required=True, choices=list(method_choices), metavar="METHOD")
    proto.add_argument("--rule", default="tpr95", choices=list(THRESHOLD_RULES), help="threshold rule (default tpr95)")
    proto.add_argument("--metric", default="auroc", choices=list(metric_choices), help="the matrix's metric (default auroc)")
    proto.add_argument("--fit-set", type=Path, help="converted training set for the methods that need a fit")
    proto.add_argument("--out", type=Path, required=True)
    proto.add_argument("--batch-size", type=positive_int, default=2, help="frames per forward pass (default 2)")
    proto.add_argument("--device", type=device)
    proto.add_argument("--resume", action="store_true", help="continue the evaluations of a killed protocol")
    add_quiet(proto)
    proto.set_defaults(run=_protocol)

    rob = sub.add_parser("robustness", help="evaluate under corruptions at 5 severities: OOD metrics, mIoU, "
                                            "calibration, type approval")
    add_model_options(rob)
    rob.add_argument("--feature-layer", help="for external models: the layer Mahalanobis models")
    rob.add_argument("--sets", type=Path, nargs="+", required=True, help="converted evaluation sets (.h5)")
    rob.add_argument("--methods", nargs="+", default=["all"], choices=["all", *method_choices], metavar="METHOD",
                     help="method names, or all (default: every method the head serves)")
    rob.add_argument("--family", choices=FAMILIES,
                     help="the corruptions by default: segood (its own 14), standard (the 15 of ImageNet-C / "
                          "Cityscapes-C, named c:NAME) or all (default segood); with --corruptions, they must be "
                          "of it")
    rob.add_argument("--corruptions", nargs="+", metavar="CORRUPTION",
                     help=f"default all of --family; segood: {', '.join(CORRUPTIONS)}; standard: "
                          f"{', '.join(STANDARD_CORRUPTIONS)} (the c: may be left out with --family standard)")
    rob.add_argument("--standard-size", choices=STANDARD_SIZES, default="fixed",
                     help="lengths of the standard corruptions: fixed (the standard's pixel sizes, comparable with "
                          "published numbers; default) or height (scaled to the frames' rows / 1024)")
    rob.add_argument("--reference", type=Path, metavar="RUN",
                     help="a finished robustness run of a reference model on the same sets and corruptions: the "
                          "summary's mCE and relative mCE are relative to it")
    rob.add_argument("--severities", type=int, nargs="+", default=[1, 2, 3, 4, 5], choices=[1, 2, 3, 4, 5],
                     metavar="LEVEL", help="levels 1-5 (default all)")
    rob.add_argument("--seed", type=natural, default=0, help="seed of the corruptions (per frame, corruption, level)")
    rob.add_argument("--requirements", type=Path, metavar="FILE.yaml",
                     help="type-approval requirements: pass/fail table in approval.md; exit status 1 on FAIL")
    add_run_options(rob)
    rob.add_argument("--no-verify", action="store_true", help="do not check frames against their set's digests")
    add_quiet(rob)
    rob.set_defaults(run=_robustness)

    approve = sub.add_parser("approve", help="check a robustness run against type-approval requirements (YAML)")
    approve.add_argument("run_dir", type=Path, metavar="RUN", help="a run folder written by segood robustness")
    approve.add_argument("requirements", type=Path, metavar="FILE.yaml")
    approve.set_defaults(run=_approve)

    export = sub.add_parser("export", help="score sets with methods and write the score maps (segood, SMIYC or "
                                           "Fishyscapes layout)")
    add_model_options(export)
    export.add_argument("--sets", type=Path, nargs="+", required=True, help="converted sets (.h5)")
    export.add_argument("--methods", nargs="+", required=True, choices=list(method_choices), metavar="METHOD")
    export.add_argument("--fit-set", type=Path, help="converted training set for the methods that need a fit")
    export.add_argument("--layout", choices=("segood", "smiyc", "fishyscapes"), default="segood",
                        help="segood: OUT/<method>/<set>.h5 (segood score reads it); smiyc: OUT/anomaly_p/<method>/"
                             "<set>/<fid>.hdf5; fishyscapes: OUT/<method>/<set>/<fid>_anomaly.npy; in these two "
                             "<set> is the folder the benchmark's code reads (e.g. AnomalyTrack-all)")
    export.add_argument("--out", type=Path, required=True)
    export.add_argument("--batch-size", type=positive_int, default=2, help="frames per forward pass (default 2)")
    export.add_argument("--device", type=device)
    add_quiet(export)
    export.set_defaults(run=_export)

    report = sub.add_parser("report", help="rebuild a run's tables and figures from its saved state")
    report.add_argument("run_dir", type=Path, metavar="RUN", help="a run folder written by segood evaluate")
    report.add_argument("--combine", type=Path, nargs="+", metavar="RUN",
                        help="more runs on the same sets (e.g. one per network) to report side by side; a method "
                             "of several runs is named by its run's folder too")
    report.add_argument("--out", type=Path, help="with --combine: the combined report's folder (default RUN_combined "
                                                 "beside RUN)")
    add_analysis_options(report)
    add_verbosity(report, progress=False)
    report.set_defaults(run=_report)

    score = sub.add_parser("score", help="evaluate per-pixel score maps computed elsewhere (HDF5)")
    score.add_argument("--scores", type=Path, required=True,
                       help="segood's HDF5 (one H×W dataset per frame id), or a folder of SMIYC <fid>.hdf5 or "
                            "Fishyscapes <fid>_anomaly.npy files")
    score.add_argument("--data", type=Path, required=True, help="the converted set the scores belong to")
    score.add_argument("--out", type=Path, required=True)
    score.add_argument("--name", default="external", help="the method's name in the tables")
    score.add_argument("--score-range", type=float, nargs=2, metavar=("LO", "HI"),
                       help="default: the file's score_range attribute")
    add_grid_options(score, scores=True)
    score.add_argument("--clip", action="store_true", help="with --num-thresholds: clip out-of-range scores into the "
                                                           "range instead of failing")
    score.add_argument("--no-verify", action="store_true", help="do not check the set's frames against its digests")
    score.add_argument("--official", choices=OFFICIAL, help="also the benchmark's own computation of its pixel "
                       "metrics (SMIYC's component metrics too), beside segood's (docs/official.md)")
    add_component_options(score, THRESHOLD_RULES, "With oracle the maps are read twice")
    add_verbosity(score, progress=False)
    score.set_defaults(run=_score)

    sub_ = sub.add_parser("submit", help="package one method of a run as a leaderboard submission (zip)")
    sub_.add_argument("run_dir", type=Path, metavar="RUN", nargs="?",
                      help="a run folder (its accumulator states); optional when --scores gives every set")
    sub_.add_argument("--method", help="the run's method to submit")
    sub_.add_argument("--scores", type=set_and_path, action="append", metavar="SET=PATH",
                      help="score maps of a set for the verified track, in any layout segood score reads (segood's "
                           "file, a folder of SMIYC <fid>.hdf5 or Fishyscapes <fid>_anomaly.npy files); repeatable")
    sub_.add_argument("--data", type=set_and_path, action="append", metavar="SET=FILE",
                      help="the converted set (or its public copy) a set's maps belong to: its frame ids, which the "
                           "folder layouts need, and its manifest hash, by which the board matches the maps; "
                           "repeatable")
    sub_.add_argument("--uses-ood-data", action="store_true", help="the method saw OOD data (a run records it "
                      "for networks trained with outlier exposure; this declares it for any other)")
    sub_.add_argument("--method-name", required=True, help="its name on the board")
    sub_.add_argument("--description", default="")
    sub_.add_argument("--allow-same-source", action="store_true", help="submit a method tuned on its test source")
    sub_.add_argument("--out", type=Path, required=True, help="the submission .zip")
    sub_.set_defaults(run=_submit)

    bench = sub.add_parser("benchmark", help="write a benchmark file (a track of official sets) for a leaderboard")
    bench.add_argument("--track", required=True)
    bench.add_argument("--sets", type=Path, nargs="+", required=True, help="the maintainer's converted sets")
    bench.add_argument("--private", nargs="+", metavar="SET", help="sets (by file stem) whose masks stay private: "
                       "entered with score maps only; a public copy without masks is written beside --out")
    bench.add_argument("--verified-only", action="store_true", help="rank only entries scored here from maps")
    bench.add_argument("--components", choices=("anomaly", "obstacle"),
                       help="also SegmentMeIfYouCan's component metrics (sIoU, PPV, F1*) of verified entries with this "
                            "preset's size filters, at each entry's best pixel-F1 threshold on each set (ORACLE)")
    bench.add_argument("--rank-by", default="auroc", choices=list(metric_choices), help=f"one of {', '.join(metric_choices)}")
    add_grid_options(bench, exact=False)  # submissions carry states: an exact one would hold every pixel
    bench.add_argument("--out", type=Path, required=True)
    bench.set_defaults(run=_benchmark)

    board = sub.add_parser("leaderboard", help="validate, recompute and rank a folder of submissions")
    board.add_argument("submissions", type=Path, help="folder of submission zips (or folders)")
    board.add_argument("--benchmark", type=Path, required=True, help="BENCH.json (segood benchmark)")
    board.add_argument("--out", type=Path, required=True, help="folder for leaderboard.md/.json and index.html")
    board.add_argument("--work", type=Path, help="folder to copy submitted score maps into while judging (default "
                                                 "--out; emptied on every exit)")
    board.set_defaults(run=_leaderboard)
    return parser


class _Parser(argparse.ArgumentParser):
    """An option of several values given twice lists both (``--sets a.h5 --sets b.h5``: both sets), where argparse
    keeps the last only; a default is replaced, not extended. An argument no command takes is refused by the
    command given (``segood export: error: ...``, with its usage), where argparse's top-level parser names none."""

    def add_argument(self, *names, **options):
        if options.get("nargs") == "+" and "action" not in options and names[0].startswith("-"):
            options["action"] = _Extend
        return super().add_argument(*names, **options)

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:
            parser = self
            for word in sys.argv[1:] if args is None else args:  # down to the (sub)command given
                commands = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)),
                                {})
                if word in commands:
                    parser = commands[word]
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        return parsed

    def error(self, message):
        """argparse's error; a name not among the registered methods, metrics or datasets also points to
        --plugin."""
        if re.match(r"argument (--methods|--metric|--rank-by|DATASET): invalid choice", message):
            message += " (one your own module registers: segood --plugin MODULE ...)"
        super().error(message)


class _Extend(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        given = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, [*(() if given is None or given is self.default else given), *values])


def _warnings_in_one_line(command):
    """segood's warnings printed as ``segood COMMAND: warning: message``, without the source line a Python warning
    shows (where a library warns, as Python prints it)."""
    import os
    import warnings

    package, python = os.path.dirname(os.path.abspath(__file__)) + os.sep, warnings.showwarning
    where = " ".join(["segood", *command])

    def show(message, category, filename, lineno, file=None, line=None):
        if not os.path.abspath(filename).startswith(package):
            python(message, category, filename, lineno, file, line)
        else:
            print(f"{where}: warning: {message}", file=sys.stderr if file is None else file)

    warnings.showwarning = show


def _add_adapter(parser, name):
    """The options of ``segood convert NAME``, from its adapter; a ValueError where they clash with the shared
    ones."""
    from segood.data.registry import ADAPTERS

    try:
        ADAPTERS[name].add_arguments(parser)
    except argparse.ArgumentError as err:
        raise ValueError(f"dataset adapter {name}: its add_arguments declares an option segood convert has already "
                         f"({err}): --out, --size, --workers, --strict, --overwrite and -q are every dataset's; name "
                         "its own options otherwise") from None


def main(argv=None):
    """The ``segood`` command (``argv``: its arguments; None: the process's, and segood's own warnings are printed
    as one line each, as its errors are)."""
    command_line, argv = argv is None, sys.argv[1:] if argv is None else list(argv)
    try:
        plugins, words = _plugins(argv)
        if command_line:
            _warnings_in_one_line(words[:1])
        from segood.registry import import_user_module

        for module in plugins:  # (before the parser: what they register joins its choices)
            import_user_module(f"--plugin {module}", module)
        converting = words[:1] == ["convert"] and len(words) > 1 and words[1]  # a dataset named: its options
        parser = build_parser(adapters=converting)  # (a ValueError: a plugin adapter's options clash)
    except ValueError as err:
        if os.environ.get("SEGOOD_TRACEBACK"):
            raise
        print(f"segood: error: {err}{_origin(err)}", file=sys.stderr)
        return 2
    args = parser.parse_args(argv)
    from segood._memory import keep_freed_memory

    keep_freed_memory()  # (a forward pass on the CPU 1.9-3.0x faster)
    from segood.io import exit_on_sigterm

    try:
        with exit_on_sigterm():  # a killed command removes its temporary files too
            return args.run(args)
    except KeyboardInterrupt:  # (Ctrl-C: temporary files removed on the way out, as for SIGTERM)
        if os.environ.get("SEGOOD_TRACEBACK"):
            raise
        resume = "; the same command with --resume continues from its last save" if _saved(args) else ""
        print(f"segood {args.command}: interrupted{resume}", file=sys.stderr)
        return 130
    except (ValueError, OSError, RuntimeError, KeyError) as err:  # bad input: one clear line, no traceback
        if os.environ.get("SEGOOD_TRACEBACK"):
            raise
        print(f"segood {args.command}: error: {_message(err)}{_origin(err)}", file=sys.stderr)
        return 2


def _plugins(argv):
    """The modules of the --plugin options before the command, and the words of ``argv`` not starting with -, less
    those modules; a ValueError for a --plugin after the command."""
    plugins, words = [], []
    for k, arg in enumerate(argv):
        flag = arg.partition("=")[0]
        if not words and len(flag) > 2 and flag != "--plugin" and "--plugin".startswith(flag):
            raise ValueError(f"{flag}: write --plugin in full")
        option = flag == "--plugin"
        if option and words:
            raise ValueError(f"--plugin MODULE goes before the command: segood --plugin MODULE {words[0]} ...")
        if option:
            plugins += [arg.partition("=")[2]] if "=" in arg else argv[k + 1:k + 2]
            if plugins and (plugins[-1].endswith(".py") or "/" in plugins[-1] or "\\" in plugins[-1]):
                module = os.path.splitext(os.path.basename(plugins[-1]))[0]
                raise ValueError(f"--plugin {plugins[-1]}: give the module's name, --plugin {module}, from the folder "
                                 "that holds it (or with that folder on PYTHONPATH)")
        elif not arg.startswith("-") and not (k and argv[k - 1] == "--plugin"):
            words.append(arg)
    return plugins, words


def _saved(args):
    """Whether a command that resumes (--resume) left a save in its output folder to resume from."""
    from pathlib import Path

    out = getattr(args, "out", None) or getattr(args, "out_dir", None)
    if not hasattr(args, "resume") or out is None or not Path(out).is_dir():
        return False
    out = Path(out)  # (a training's last.pt, a run's state.npz, the protocol's runs', the attack's state/ records)
    return (out / "last.pt").exists() or any(out.rglob("state*.npz")) or any((out / "state").rglob("*.json"))


def _origin(err):
    """Where the user's own code (a network, a loader, a scorer) raised ``err``: its innermost frame outside segood,
    Python and the installed libraries, as ' (raised at FILE:LINE, in FUNCTION; ...)'; '' where there is none."""
    import site
    import sysconfig
    import traceback
    from pathlib import Path

    places = [sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib", "purelib", "platlib")]
    places += [*site.getsitepackages(), site.getusersitepackages()]
    libraries = [Path(__file__).resolve().parent] + [Path(place).resolve() for place in places]
    chain = [err]  # the error and what it was raised from (re-raised "from None", a cause is the context still)
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    for cause in chain:
        for frame in reversed(traceback.extract_tb(cause.__traceback__)):
            if not Path(frame.filename).is_absolute():  # (frozen modules' <...>, compiled ones' h5py/h5f.pyx)
                continue
            path = Path(frame.filename).resolve()
            if not any(path.is_relative_to(p) for p in libraries):
                return (f" (raised at {frame.filename}:{frame.lineno}, in {frame.name}; SEGOOD_TRACEBACK=1 shows the "
                        "whole traceback)")
    return ""


def _message(err):
    """An error's own words: a KeyError's without quotes, an OSError segood wrote without "[Errno N]" before it."""
    if isinstance(err, KeyError) and err.args:
        return err.args[0]
    if isinstance(err, OSError) and err.strerror and err.filename is None:
        return err.strerror
    return err
