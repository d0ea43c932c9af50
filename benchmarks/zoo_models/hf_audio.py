"""Transformers speech architectures: CTC, audio classification and speech-to-text heads, on
random waveforms (or log-mel-like features) of ragged lengths, trained through ``hf_setup``.

The collators are the ones the Hugging Face speech examples define (``DataCollatorCTCWithPadding``,
``DataCollatorSpeechSeq2SeqWithPadding``): pad the audio, build its attention mask, pad the
labels with -100. The wav2vec2 family's SpecAugment time masking (``mask_time_prob``) draws from
numpy's global RNG, which the harness checkpoints; ``mask_time_length=2`` makes it mask here.
"""

from __future__ import annotations

from typing import Any

import torch
from zoo_common import LABELS, SAMPLES, VOCAB, factories, gen

from reproci.worker.contract import ModelContext

CTC_VOCAB = 32  # character vocabulary of the CTC heads; id 0 is the pad (CTC blank)
WAVE = 800  # samples of the longest waveform: 79 frames after the two-layer conv feature extractor
FEATURE_ENCODER = dict(conv_dim=(16, 16), conv_kernel=(10, 3), conv_stride=(5, 2), num_conv_pos_embeddings=16,
                       num_conv_pos_embedding_groups=2)
SPEECH = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, vocab_size=CTC_VOCAB,
              pad_token_id=0, mask_time_length=2, ctc_loss_reduction="mean", num_labels=LABELS,
              classifier_proj_size=16)
W2V = {**SPEECH, **FEATURE_ENCODER}


def _pad(rows: list[torch.Tensor], value: float) -> tuple[torch.Tensor, torch.Tensor]:
    longest = max(r.shape[0] for r in rows)
    out = torch.full((len(rows), longest, *rows[0].shape[1:]), value, dtype=rows[0].dtype)
    mask = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, r in enumerate(rows):
        out[i, :r.shape[0]] = r
        mask[i, :r.shape[0]] = 1
    return out, mask


class DataCollatorCTCWithPadding:
    """Pads ``input_values`` (or ``input_features``) with zeros and builds the attention mask;
    pads ``labels`` with -100 (a list of ids: CTC, seq2seq) or stacks them (a class)."""

    def __init__(self, key: str = "input_values", mask: bool = True) -> None:
        self.key, self.mask = key, mask

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        audio, mask = _pad([f[self.key] for f in features], 0.0)
        batch = {self.key: audio}
        if self.mask:
            batch["attention_mask"] = mask
        batch["labels"] = _labels(features)
        return batch


def _labels(features: list[dict[str, Any]]) -> torch.Tensor:
    """Transcripts padded with -100 (ignored by the loss), or one class id per sample."""
    labels = [f["labels"] for f in features]
    if isinstance(labels[0], list):
        padded, lmask = _pad([torch.tensor(x) for x in labels], 0)
        return padded.masked_fill(lmask == 0, -100)
    return torch.tensor(labels)


def _lengths(g: torch.Generator, low: int, high: int, n: int = SAMPLES) -> list[int]:
    return torch.randint(low, high + 1, (n,), generator=g).tolist()


def waves_ctc(ctx: ModelContext, offset: int = 0) -> list[dict[str, Any]]:
    g = gen(ctx, offset)
    return [{"input_values": torch.randn(k, generator=g),
             "labels": torch.randint(1, CTC_VOCAB, (j,), generator=g).tolist()}
            for k, j in zip(_lengths(g, WAVE - 160, WAVE), _lengths(g, 2, 5))]


def waves_cls(ctx: ModelContext, offset: int = 0) -> list[dict[str, Any]]:
    g = gen(ctx, offset)
    return [{"input_values": torch.randn(k, generator=g), "labels": int(torch.randint(0, LABELS, (), generator=g))}
            for k in _lengths(g, WAVE - 160, WAVE)]


def features(frames: int, bins: int, ragged: bool, text: bool, fixed_frames: bool = False, vocab: int = VOCAB) -> Any:
    """Log-mel-like features ``(frames, bins)`` with text labels (speech-to-text) or a class."""
    def data(ctx: ModelContext, offset: int = 0) -> list[dict[str, Any]]:
        g = gen(ctx, offset)
        lengths = _lengths(g, frames - 8, frames) if ragged else [frames] * SAMPLES
        out = []
        for k in lengths:
            x = torch.randn(k, bins, generator=g)
            y = (torch.randint(5, vocab, (int(torch.randint(4, 9, (), generator=g)),), generator=g).tolist() if text
                 else int(torch.randint(0, LABELS, (), generator=g)))
            out.append({"input_features": x.T.contiguous() if fixed_frames else x, "labels": y})
        return out
    return data


def _mel_first(key: str) -> Any:
    """Whisper's features are ``(bins, frames)``: stacked as they are (fixed length)."""
    def make(model: torch.nn.Module) -> Any:
        def collate(fs: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
            batch = {key: torch.stack([f[key] for f in fs])}
            batch["labels"] = _labels(fs)
            return batch
        return collate
    return make


def ctc(cfg: str, cls: str, **kw: Any) -> dict:
    return {"config": (cfg, {**W2V, **kw}), "model": cls, "task": "ctc", "head": "CTC", "data": waves_ctc,
            "collator": lambda m: DataCollatorCTCWithPadding()}


def audiocls(cfg: str, cls: str, **kw: Any) -> dict:
    return {"config": (cfg, {**W2V, **kw}), "model": cls, "task": "audiocls", "head": "audio classification",
            "data": waves_cls, "collator": lambda m: DataCollatorCTCWithPadding()}


WHISPER = dict(vocab_size=VOCAB, num_mel_bins=16, encoder_layers=2, encoder_attention_heads=2, decoder_layers=2,
               decoder_attention_heads=2, d_model=32, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=16,
               max_target_positions=32, pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2,
               begin_suppress_tokens=None, suppress_tokens=None, num_labels=LABELS, classifier_proj_size=16)

SPECS = {
    "wav2vec2_ctc": ctc("Wav2Vec2Config", "Wav2Vec2ForCTC"),
    "hubert_ctc": ctc("HubertConfig", "HubertForCTC"),
    "wavlm_ctc": ctc("WavLMConfig", "WavLMForCTC", num_buckets=16, max_bucket_distance=32),
    "unispeech_ctc": ctc("UniSpeechConfig", "UniSpeechForCTC"),
    "unispeech_sat_ctc": ctc("UniSpeechSatConfig", "UniSpeechSatForCTC"),
    "sew_ctc": ctc("SEWConfig", "SEWForCTC", squeeze_factor=2),
    "sew_d_ctc": ctc("SEWDConfig", "SEWDForCTC", squeeze_factor=2, position_buckets=16, max_relative_positions=32),
    "data2vec_audio_ctc": ctc("Data2VecAudioConfig", "Data2VecAudioForCTC", conv_pos_kernel_size=5,
                              num_conv_pos_embeddings=5),
    "wav2vec2_conformer_ctc": ctc("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerForCTC",
                                  conv_depthwise_kernel_size=7, position_embeddings_type="rotary"),
    "wav2vec2_bert_ctc": {"config": ("Wav2Vec2BertConfig", dict(SPEECH, feature_projection_input_dim=16,
                                                                conv_depthwise_kernel_size=7)),
                          "model": "Wav2Vec2BertForCTC", "task": "ctc", "head": "CTC",
                          "data": features(40, 16, ragged=True, text=True, vocab=CTC_VOCAB),
                          "collator": lambda m: DataCollatorCTCWithPadding("input_features")},
    "wav2vec2_audiocls": audiocls("Wav2Vec2Config", "Wav2Vec2ForSequenceClassification"),
    "hubert_audiocls": audiocls("HubertConfig", "HubertForSequenceClassification"),
    "wavlm_audiocls": audiocls("WavLMConfig", "WavLMForSequenceClassification", num_buckets=16, max_bucket_distance=32),
    "ast": {"config": ("ASTConfig", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                         intermediate_size=64, patch_size=8, frequency_stride=8, time_stride=8,
                                         max_length=32, num_mel_bins=16, num_labels=LABELS)),
            "model": "ASTForAudioClassification", "task": "audiocls", "head": "audio classification",
            "data": lambda ctx, offset=0: [{"input_values": f["input_features"], "labels": f["labels"]}
                                           for f in features(32, 16, ragged=False, text=False)(ctx, offset)],
            "collator": lambda m: DataCollatorCTCWithPadding(mask=False)},
    "whisper_audiocls": {"config": ("WhisperConfig", WHISPER), "model": "WhisperForAudioClassification",
                         "task": "audiocls", "head": "audio classification",
                         "data": features(32, 16, ragged=False, text=False, fixed_frames=True),
                         "collator": _mel_first("input_features")},
    "whisper": {"config": ("WhisperConfig", WHISPER), "model": "WhisperForConditionalGeneration", "task": "asr",
                "head": "speech seq2seq", "data": features(32, 16, ragged=False, text=True, fixed_frames=True),
                "collator": _mel_first("input_features")},
    "speech_to_text": {"config": ("Speech2TextConfig", dict(vocab_size=VOCAB, d_model=32, encoder_layers=2,
                                                            decoder_layers=2, encoder_attention_heads=2,
                                                            decoder_attention_heads=2, encoder_ffn_dim=64,
                                                            decoder_ffn_dim=64, max_source_positions=64,
                                                            max_target_positions=32, input_feat_per_channel=16,
                                                            num_conv_layers=2, conv_channels=32,
                                                            conv_kernel_sizes=(5, 5), pad_token_id=0, bos_token_id=2,
                                                            eos_token_id=3, decoder_start_token_id=2)),
                       "model": "Speech2TextForConditionalGeneration", "task": "asr", "head": "speech seq2seq",
                       "data": features(40, 16, ragged=True, text=True),
                       "collator": lambda m: DataCollatorCTCWithPadding("input_features")},
}

factories(SPECS, globals())
