"""Transformers image classification architectures (32×32 random images, 3 classes), trained
through ``hf_setup`` with ``default_data_collator`` (``pixel_values`` and ``labels``)."""

from __future__ import annotations

from zoo_common import factories

VIT = dict(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
           intermediate_size=64, num_labels=3)
STAGES = dict(num_labels=3)


def image(cfg: str, cls: str, **kw) -> dict:
    return {"config": (cfg, {**STAGES, **kw}), "model": cls, "task": "image", "head": "image classification"}


SPECS = {
    "vit": image("ViTConfig", "ViTForImageClassification", **VIT),
    "deit": image("DeiTConfig", "DeiTForImageClassification", **VIT),
    "beit": image("BeitConfig", "BeitForImageClassification", **VIT),
    "data2vec_vision": image("Data2VecVisionConfig", "Data2VecVisionForImageClassification", **VIT),
    "dinov2": image("Dinov2Config", "Dinov2ForImageClassification", **VIT),
    "vit_msn": image("ViTMSNConfig", "ViTMSNForImageClassification", **VIT),
    "ijepa": image("IJepaConfig", "IJepaForImageClassification", **VIT),
    "convnext": image("ConvNextConfig", "ConvNextForImageClassification", hidden_sizes=[8, 16], depths=[1, 1],
                      num_stages=2, patch_size=2),
    "convnextv2": image("ConvNextV2Config", "ConvNextV2ForImageClassification", hidden_sizes=[8, 16], depths=[1, 1],
                        num_stages=2, patch_size=2),
    "resnet": image("ResNetConfig", "ResNetForImageClassification", embedding_size=8, hidden_sizes=[8, 16],
                    depths=[1, 1], layer_type="basic"),
    "regnet": image("RegNetConfig", "RegNetForImageClassification", embedding_size=8, hidden_sizes=[8, 16],
                    depths=[1, 1], groups_width=8),
    "bit": image("BitConfig", "BitForImageClassification", embedding_size=8, hidden_sizes=[8, 16, 16, 16],
                 depths=[1, 1, 1, 1], num_groups=4),
    "swin": image("SwinConfig", "SwinForImageClassification", image_size=32, patch_size=4, embed_dim=16,
                  depths=[1, 1], num_heads=[2, 2], window_size=4),
    "swinv2": image("Swinv2Config", "Swinv2ForImageClassification", image_size=32, patch_size=4, embed_dim=16,
                    depths=[1, 1], num_heads=[2, 2], window_size=4),
    "focalnet": image("FocalNetConfig", "FocalNetForImageClassification", image_size=32, patch_size=4, embed_dim=16,
                      depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3]),
    "poolformer": image("PoolFormerConfig", "PoolFormerForImageClassification", hidden_sizes=[8, 16],
                        depths=[1, 1], num_encoder_blocks=2, patch_sizes=[7, 3], strides=[4, 2], padding=[2, 1]),
    "mobilenet_v1": image("MobileNetV1Config", "MobileNetV1ForImageClassification", image_size=32, depth_multiplier=0.25),
    "mobilenet_v2": image("MobileNetV2Config", "MobileNetV2ForImageClassification", image_size=32, depth_multiplier=0.25),
    "mobilevit": image("MobileViTConfig", "MobileViTForImageClassification", image_size=32, patch_size=2,
                       hidden_sizes=[16, 16, 16], neck_hidden_sizes=[8, 8, 16, 16, 16, 16, 32],
                       num_attention_heads=2, expand_ratio=2.0),
    "efficientnet": image("EfficientNetConfig", "EfficientNetForImageClassification", image_size=32,
                          width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=128),
    "pvt": image("PvtConfig", "PvtForImageClassification", image_size=32, num_encoder_blocks=2, depths=[1, 1],
                 sequence_reduction_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[4, 2], strides=[4, 2],
                 num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
    "pvt_v2": image("PvtV2Config", "PvtV2ForImageClassification", image_size=32, num_encoder_blocks=2, depths=[1, 1],
                    sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                    num_attention_heads=[1, 2], mlp_ratios=[2, 2]),
    "segformer": image("SegformerConfig", "SegformerForImageClassification", num_encoder_blocks=2, depths=[1, 1],
                       sr_ratios=[2, 1], hidden_sizes=[16, 32], patch_sizes=[7, 3], strides=[4, 2],
                       num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=32),
    "levit": image("LevitConfig", "LevitForImageClassification", image_size=32, patch_size=16, hidden_sizes=[16, 32],
                   num_attention_heads=[1, 2], depths=[1, 1], key_dim=[8, 8], drop_path_rate=0, mlp_ratio=[2, 2],
                   attention_ratio=[2, 2], down_ops=[["Subsample", 8, 1, 2, 2, 2]]),
    # CvtStage indexes its drop-path rates by the stage, not the layer: each stage needs depth >= its index + 1
    "cvt": image("CvtConfig", "CvtForImageClassification", embed_dim=[16, 32], num_heads=[1, 2], depth=[1, 2],
                 patch_sizes=[7, 3], patch_stride=[4, 2], patch_padding=[2, 1], mlp_ratio=[2.0, 2.0],
                 attention_drop_rate=[0.0, 0.0], drop_rate=[0.0, 0.0], drop_path_rate=[0.0, 0.0], qkv_bias=[True, True],
                 cls_token=[False, True], qkv_projection_method=["dw_bn", "dw_bn"], kernel_qkv=[3, 3],
                 padding_kv=[1, 1], stride_kv=[2, 2], padding_q=[1, 1], stride_q=[1, 1]),
    "swiftformer": image("SwiftFormerConfig", "SwiftFormerForImageClassification", image_size=32, depths=[1, 1],
                         embed_dims=[16, 32], downsamples=[True, True]),
}

factories(SPECS, globals())
