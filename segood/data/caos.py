"""The two protocols of the CAOS benchmark's datasets (StreetHazards, BDD-Anomaly), which their adapters share:
``segood`` (the default: a label of no class ignored, numbers pooled over pixels) and ``original``, the CAOS code's
(that label counted as ID, each metric averaged per image: the set records ``per_image_headline``)."""

from segood.data.common import Sample, SkipFrame

PROTOCOLS = {"segood": "ignore", "original": "id"}  # protocol -> the role of the label of no class


class CAOSProtocols:
    """Mixin of an :class:`~segood.data.adapter.Adapter` with ``--protocol``. A subclass names its label of no class
    (``unlabeled``, e.g. "void (255)"), its per-image headline (``headline``) and its label tables per protocol
    (``tables``), and calls :meth:`_use_protocol` in its ``__init__``."""

    unlabeled = headline = ""
    tables = {}

    def _use_protocol(self, protocol):
        if protocol not in PROTOCOLS:
            raise ValueError(f"{self.tables['segood'].name} protocol must be one of {tuple(PROTOCOLS)}, got "
                             f"{protocol!r} (segood: {self.unlabeled} ignored, pooled; original: {self.unlabeled} "
                             "ID, per-image means as the headline)")
        self.table = self.tables[protocol]
        self.label_map_sha256 = self.table.sha256
        self.params = {"protocol": protocol}

    @classmethod
    def add_arguments(cls, parser):
        super().add_arguments(parser)
        parser.add_argument("--protocol", choices=tuple(PROTOCOLS), default="segood",
                            help=f"segood (default): {cls.unlabeled} ignored, numbers pooled over pixels; original: "
                                 f"{cls.unlabeled} ID and per-image means beside the pooled numbers, as CAOS evaluates")

    @classmethod
    def from_args(cls, args):
        return cls(args.root, args.split, protocol=args.protocol)

    def _sample(self, image, raw, frame_id):
        """The sample of a frame's image and its raw CAOS labels, through the protocol's table."""
        if raw.shape != image.shape[:2]:
            raise SkipFrame(f"image {image.shape[:2]} and labels {raw.shape} differ in size")
        ood_mask, semantic, extra = self.table.apply(raw)
        return Sample(image, ood_mask, semantic, frame_id, extra)

    def summary(self, extras):
        return self.table.summary(extras)

    def provenance(self):
        headline = {"per_image_headline": self.headline} if self.params["protocol"] == "original" else {}
        return {**super().provenance(), **headline}
