"""Tiny networks with seeded random weights, the same on every call."""

import torch

from segood.models import build_model


def tiny_network(head="plain", **options):
    """A PSPNet with a ResNet-18 encoder, weights drawn after ``torch.manual_seed(0)``, in eval mode.

    Args:
        head: the head of :func:`segood.models.build_model` ("plain", "dropout", "dimreduce", ...).
        **options: further keyword options of :func:`segood.models.build_model` (``dropout_p``, ...).
    """
    torch.manual_seed(0)
    return build_model("pspnet", "resnet18", head=head, **options).eval()
