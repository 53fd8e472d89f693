"""The dataset adapter protocol: how a raw dataset becomes segood frames (one module and one decorator each).

An adapter lists its frames (``refs``), names them (``frame_id``) and reads one (``load`` -> :class:`Sample`,
or :class:`SkipFrame` with the reason). Everything else has a default here: the size a conversion resizes to
(none: native sizes), frames without public labels (``has_labels``), the provenance written into the set, frames
dropped before loading, a summary for the manifest (e.g. SUN's label-map coverage) and the command-line options
of ``segood convert NAME``. Adapters must be picklable: ``segood convert --workers N`` sends them to worker
processes.

Recipe (``docs/extending.md``): subclass :class:`Adapter`, set ``name``, ``source`` and ``help``, implement
the three methods, decorate the class with ``@register_adapter`` (and import its module in
:mod:`segood.data.registry`).
"""

from pathlib import Path

from segood.registry import Registry

#: Every dataset adapter by name (``segood convert NAME``); ``@register_adapter`` adds one.
ADAPTERS = Registry("dataset adapter", reserved=("mix", "coverage"))  # (segood convert's other commands)
register_adapter = ADAPTERS.register

CITYSCAPES_SIZE = (1024, 2048)  # (H, W): Cityscapes' frames, and the size the paper resizes SUN to


class Adapter:
    """Base of every dataset adapter.

    Class attributes: ``name`` (registry key and ``segood convert`` subcommand), ``source`` (the dataset's name
    in manifests and set identities), ``help`` (one line for ``--help``: what is ID, OOD and ignore),
    ``default_split`` (the ``--split`` default, ``None`` when the dataset has no splits).
    Instance attributes recorded as provenance: ``split``, ``seed``, ``label_map_sha256``, ``params``.
    """

    name = source = help = ""
    default_split = "val"
    split = ""
    seed = 0
    label_map_sha256 = ""
    params = {}
    # Frames that cannot be converted are failures (``strict`` stops on them); frames that a documented rule of the
    # dataset leaves out (SUN's size filter, LostAndFound's testNoKnown) are not, and go under ``unused_files``.
    prefiltered = ()  # [(frame_id, reason)] of frames found unconvertible before loading (unreadable annotations)
    unused_files = ()  # [(path in the raw tree, reason)] of files the adapter found and did not use

    def refs(self):
        """The frames to convert, in a stable order (paths, indices: anything picklable)."""
        raise NotImplementedError(f"{type(self).__name__} must implement refs()")

    def frame_id(self, ref):
        """A stable string naming the frame, from its source path."""
        raise NotImplementedError(f"{type(self).__name__} must implement frame_id(ref)")

    def has_labels(self, ref):
        """False for a frame without public labels (e.g. a benchmark's test frame): it is converted with an
        all-ignore mask, listed under the manifest's ``unlabelled_frames``, and can be scored and exported but
        never evaluated. Default: every frame has labels."""
        return True

    def load(self, ref):
        """The frame as a :class:`~segood.data.common.Sample` at its native size; raise ``SkipFrame(reason)``
        for a frame that cannot be converted, ``LeftOut(reason, file)`` for one a rule of the dataset leaves out."""
        raise NotImplementedError(f"{type(self).__name__} must implement load(ref)")

    @property
    def default_size(self):
        """(H, W) a conversion resizes every frame to unless told otherwise, or None (the default): each frame keeps
        its native size, as today's benchmarks evaluate them."""
        return None

    def provenance(self):
        """The attributes every converted set records about where its frames came from."""
        return {"source": self.source, "split": self.split, "seed": self.seed,
                "label_map_sha256": self.label_map_sha256, "params": dict(self.params)}

    def summary(self, extras):
        """Extra manifest entries from the ``Sample.extra`` of every converted frame (default: none). A
        ``"warnings"`` entry (a list of sentences) is issued as warnings and printed by ``segood convert``."""
        return {}

    def reports(self, summary):
        """{file suffix: Markdown} written beside the set from :meth:`summary` (default: none)."""
        return {}

    @classmethod
    def add_arguments(cls, parser):
        """The options of ``segood convert NAME`` beyond the shared ones (default: the raw root and a split)."""
        parser.add_argument("root", type=Path, help="the raw dataset folder (layouts: datasets/README.md)")
        if cls.default_split is not None:
            parser.add_argument("--split", default=cls.default_split, help=f"default {cls.default_split}")

    @classmethod
    def from_args(cls, args):
        """The adapter for parsed ``segood convert NAME`` arguments."""
        return cls(args.root, args.split) if cls.default_split is not None else cls(args.root)
