"""Transformers vision-language architectures with tiny configs: contrastive image-text
(CLIP, SigLIP: ``return_loss=True``), image captioning (a ViT encoder with a GPT-2 decoder in
VisionEncoderDecoderModel) and an image-conditioned causal LM (LLaVA: a CLIP vision tower, a
projector and a Llama), on random images and synthetic token ids, trained through ``hf_setup``."""

from __future__ import annotations

from typing import Any

import torch
from zoo_common import SEQ, VOCAB, factories, images, token_rows, tokenizer

from reproci.worker.contract import ModelContext

IMAGE, PATCH = 32, 8
PATCHES = (IMAGE // PATCH) ** 2  # image tokens LLaVA puts in the text (CLS dropped: "default" strategy)
TOWER = dict(image_size=IMAGE, patch_size=PATCH, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=2)
TEXT = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64)
EOS = 3


def image_text(ctx: ModelContext, offset: int = 0) -> list[dict[str, Any]]:
    rows = token_rows(ctx, offset=offset)
    return [{"input_ids": r + [EOS], "pixel_values": im["pixel_values"]} for r, im in zip(rows, images(ctx, offset=offset))]


def captions(ctx: ModelContext, offset: int = 0) -> list[dict[str, Any]]:
    rows = token_rows(ctx, offset=offset)
    return [{"pixel_values": im["pixel_values"], "labels": r + [EOS]} for r, im in zip(rows, images(ctx, offset=offset))]


def _pad_labels(labels: list[list[int]]) -> torch.Tensor:
    longest = max(map(len, labels))
    return torch.tensor([x + [-100] * (longest - len(x)) for x in labels])


class ImageTextCollator:
    """Pads the text (``tokenizer.pad``), stacks the images; ``return_loss`` for the
    contrastive models; LLaVA's labels are its input ids with the image tokens and padding masked."""

    def __init__(self, return_loss: bool = False, lm_labels: int | None = None, padding: Any = True) -> None:
        self.return_loss, self.lm_labels, self.padding = return_loss, lm_labels, padding

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        batch = dict(tokenizer().pad([{"input_ids": f["input_ids"]} for f in features], padding=self.padding,
                                     max_length=SEQ + 1 if self.padding == "max_length" else None,
                                     return_tensors="pt"))
        batch["pixel_values"] = torch.stack([f["pixel_values"] for f in features])
        if self.return_loss:
            batch["return_loss"] = True
        if self.lm_labels is not None:
            labels = batch["input_ids"].clone()
            labels[(labels == self.lm_labels) | (batch["attention_mask"] == 0)] = -100
            batch["labels"] = labels
        return batch


def caption_collator(features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {"pixel_values": torch.stack([f["pixel_values"] for f in features]),
            "labels": _pad_labels([f["labels"] for f in features])}


def llava_data(ctx: ModelContext, offset: int = 0) -> list[dict[str, Any]]:
    rows = token_rows(ctx, offset=offset)
    return [{"input_ids": [VOCAB] * PATCHES + r, "pixel_values": im["pixel_values"]}
            for r, im in zip(rows, images(ctx, offset=offset))]


def _vision_encoder_decoder(cfg: Any) -> torch.nn.Module:
    from transformers import VisionEncoderDecoderModel

    return VisionEncoderDecoderModel(cfg)


def _captioner(**_: Any) -> Any:
    from transformers import GPT2Config, VisionEncoderDecoderConfig, ViTConfig

    cfg = VisionEncoderDecoderConfig.from_encoder_decoder_configs(
        ViTConfig(**TOWER), GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=2, eos_token_id=EOS, pad_token_id=0))
    cfg.decoder_start_token_id, cfg.pad_token_id = 2, 0
    return cfg


def _llava(**_: Any) -> Any:
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    return LlavaConfig(vision_config=CLIPVisionConfig(**TOWER),
                       text_config=LlamaConfig(**{**TEXT, "vocab_size": VOCAB + 1}, num_key_value_heads=2,
                                               pad_token_id=0, bos_token_id=2, eos_token_id=EOS),
                       image_token_id=VOCAB, vision_feature_layer=-1, vision_feature_select_strategy="default",
                       projector_hidden_act="gelu")


SPECS = {
    "clip": {"config": ("CLIPConfig", dict(text_config={**TEXT, "bos_token_id": 2, "eos_token_id": EOS, "pad_token_id": 0},
                                           vision_config=TOWER, projection_dim=16)),
             "model": "CLIPModel", "task": "vlm", "head": "contrastive image-text", "data": image_text,
             "collator": lambda m: ImageTextCollator(return_loss=True)},
    "siglip": {"config": ("SiglipConfig", dict(text_config={**TEXT, "bos_token_id": 2, "eos_token_id": EOS, "pad_token_id": 0},
                                               vision_config=TOWER)),
               "model": "SiglipModel", "task": "vlm", "head": "contrastive image-text", "data": image_text,
               # SigLIP's text tower pools the last position: pad every caption to one length, as its processor does
               "collator": lambda m: ImageTextCollator(return_loss=True, padding="max_length")},
    "vision_encoder_decoder": {"config": (_captioner, {}), "model": "VisionEncoderDecoderModel",
                               "make": _vision_encoder_decoder, "task": "vlm", "head": "image captioning",
                               "data": captions, "collator": lambda m: caption_collator},
    "llava": {"config": (_llava, {}), "model": "LlavaForConditionalGeneration", "task": "vlm",
              "head": "image-text causal LM", "data": llava_data,
              "collator": lambda m: ImageTextCollator(lm_labels=VOCAB)},
}

factories(SPECS, globals())
