"""Tiny networks with seeded random weights, the same on every call."""

import torch

from segood.models import build_model


def tiny_network(head="plain", seed=0, **options):
    """A PSPNet with a ResNet-18 encoder, weights drawn after ``torch.manual_seed(seed)``, in eval mode.

    Args:
        head: the head of :func:`segood.models.build_model` ("plain", "dropout", "dimreduce", ...).
        **options: further keyword options of :func:`segood.models.build_model` (``dropout_p``, ...).
    """
    torch.manual_seed(seed)
    return build_model("pspnet", "resnet18", head=head, **options).eval()


def tiny_mask2former(labels=4, queries=5, **options):
    """A transformers Mask2Former (Swin backbone) of ``labels`` classes (a number, or their names), random weights
    after ``torch.manual_seed(0)``, in eval mode; ``options``: further ``Mask2FormerConfig`` settings."""
    from transformers import Mask2FormerConfig, Mask2FormerForUniversalSegmentation, SwinConfig

    torch.manual_seed(0)
    names = labels if isinstance(labels, (list, tuple)) else [f"class{i}" for i in range(labels)]
    swin = SwinConfig(embed_dim=32, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2], window_size=4, image_size=64,
                      out_features=["stage1", "stage2", "stage3", "stage4"])
    config = Mask2FormerConfig(backbone_config=swin, feature_size=32, mask_feature_size=32, hidden_dim=32,
                               encoder_feedforward_dim=32, encoder_layers=1, decoder_layers=2, num_attention_heads=2,
                               dim_feedforward=32, num_queries=queries, id2label=dict(enumerate(names)),
                               label2id={n: i for i, n in enumerate(names)}, **options)
    return Mask2FormerForUniversalSegmentation(config).eval()


def tiny_eomt(labels=4):
    """A transformers EoMT (a plain ViT with queries) of ``labels`` classes at 64x64, as :func:`tiny_mask2former`."""
    from transformers import EomtConfig, EomtForUniversalSegmentation

    torch.manual_seed(0)
    config = EomtConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=64, patch_size=16,
                        num_queries=5, num_blocks=1, num_upscale_blocks=2,
                        id2label={i: f"class{i}" for i in range(labels)})
    return EomtForUniversalSegmentation(config).eval()
