"""IDD (India Driving Dataset, segmentation): polygon JSON rasterised in file order; car = ID,
autorickshaw = OOD, all else ignore (the seed paper's §3.2); ``semantic`` via the csTrainId table."""


import numpy as np
from cityscapesscripts.helpers.annotation import Annotation

from segood.data.adapter import register_adapter
from segood.data.common import LeftOut, Sample, SkipFrame, SplitTree, load_label_map, rasterise, read_rgb
from segood.labels import ID, IGNORE, OOD

EXPECTED_TREE = """\
<root>/leftImg8bit/{train,val,test}/<seq>/<frame>_leftImg8bit.png   (or .jpg)
<root>/gtFine/{train,val}/<seq>/<frame>_gtFine_polygons.json"""
_ROLE_VALUE = {"id": ID, "ood": OOD}


@register_adapter
class IDD(SplitTree):
    """Frames of one split, listed from the polygon files (an image without labels cannot be scored)."""

    name = source = "idd"
    help = "polygon JSON in file order; car ID, autorickshaw OOD, the rest ignore"
    listed, suffix, hint, expected = "gtFine", "_gtFine_polygons.json", "IDD", EXPECTED_TREE

    def __init__(self, root, split="val", label_map="idd"):
        super().__init__(root, split)
        self.label_map, self.label_map_sha256 = load_label_map(label_map, ("cs_train_id", "eval_roles"))
        table = self.label_map["cs_train_id"]
        self.names = list(table)
        self.train_id = {name: IGNORE if v is None else int(v) for name, v in table.items()}
        roles = self.label_map["eval_roles"]
        self.role = {name: _ROLE_VALUE[roles[name]] if name in roles else IGNORE for name in self.names}

    @classmethod
    def add_arguments(cls, parser):
        super().add_arguments(parser)
        parser.add_argument("--label-map", default="idd", help="a label map name or YAML (default label_maps/idd.yaml)")

    @classmethod
    def from_args(cls, args):
        return cls(args.root, args.split, label_map=args.label_map)

    def load(self, json_path):
        stem = self.stem(json_path)
        seq = json_path.parent.name
        frame_id = self.frame_id(json_path)
        folder = self.root / "leftImg8bit" / self.split / seq
        image_path = next((p for p in (folder / f"{stem}_leftImg8bit.png", folder / f"{stem}_leftImg8bit.jpg")
                           if p.is_file()), None)
        if image_path is None:
            raise SkipFrame(f"no image {stem}_leftImg8bit.png or .jpg")
        annotation = Annotation()
        try:
            annotation.fromJsonFile(str(json_path))
        except (OSError, ValueError, KeyError, TypeError, IndexError, OverflowError) as err:
            raise SkipFrame(f"unreadable polygon JSON ({type(err).__name__}: {err})") from None
        image = read_rgb(image_path)
        height, width = image.shape[:2]
        if (annotation.imgHeight, annotation.imgWidth) != (height, width):
            raise SkipFrame(f"JSON says {annotation.imgHeight}x{annotation.imgWidth}, image is {height}x{width}")

        labels, polygons = [], []
        for obj in annotation.objects:
            if _deleted(obj):
                continue
            label = obj.label
            if label not in self.train_id and label.endswith("group"):  # "cargroup" -> "car"
                label = label[: -len("group")]
            if label not in self.train_id:
                raise SkipFrame(f"unknown IDD label {obj.label!r}")
            try:
                points = np.array([(p.x, p.y) for p in obj.polygon], dtype=np.float64).reshape(-1, 2)
            except (TypeError, ValueError, OverflowError) as err:
                raise SkipFrame(f"polygon {len(polygons)} ({obj.label!r}) has a non-numeric coordinate ({err})") from None
            if len(points) < 3 or points[:, 0].max() < 0 or points[:, 1].max() < 0 \
                    or points[:, 0].min() >= width or points[:, 1].min() >= height:
                raise SkipFrame(f"polygon {len(polygons)} ({obj.label!r}) lies outside the image or has < 3 points")
            labels.append(label)
            polygons.append(points)
        if not polygons:
            raise LeftOut("an annotation with no polygon that is not deleted",
                          json_path.relative_to(self.root).as_posix())
        painted = rasterise(polygons, height, width, labels)

        background = self.label_map["background"]
        semantic_lut = np.array([self.train_id[background]] + [self.train_id[n] for n in labels], np.uint8)
        role_lut = np.array([self.role[background]] + [self.role[n] for n in labels], np.uint8)
        return Sample(image, role_lut[painted], semantic_lut[painted], frame_id)


def _deleted(obj):
    """Whether an annotation's object is deleted: its ``deleted`` 0 or 1, as a number or as text (a re-exported
    file's "0" is not deleted); any other value skips the frame."""
    value = obj.deleted
    if isinstance(value, str):
        value = value.strip()
    if value in (0, 1, "0", "1"):  # (True and False are 1 and 0)
        return value in (1, "1")
    raise SkipFrame(f"object {obj.label!r} has deleted={value!r}; expected 0 or 1")
