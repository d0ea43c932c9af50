"""Transformers encoder-decoder text architectures (the target is the source reversed),
trained through ``hf_setup`` with DataCollatorForSeq2Seq, which makes ``decoder_input_ids``
from the labels with the model's own ``prepare_decoder_input_ids_from_labels``."""

from __future__ import annotations

from zoo_common import VOCAB, factories

IDS = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, decoder_start_token_id=2)
POS = 64
T5 = dict(vocab_size=VOCAB, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=2,
          pad_token_id=0, eos_token_id=3, decoder_start_token_id=0)
BART = dict(vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=POS, **IDS)


def s2s(cfg: str, cls: str, **kw) -> dict:
    return {"config": (cfg, kw), "model": cls, "task": "seq2seq", "head": "seq2seq LM"}


SPECS = {
    "t5": s2s("T5Config", "T5ForConditionalGeneration", **T5),
    "mt5": s2s("MT5Config", "MT5ForConditionalGeneration", **T5),
    "umt5": s2s("UMT5Config", "UMT5ForConditionalGeneration", **T5),
    "long_t5": s2s("LongT5Config", "LongT5ForConditionalGeneration", **T5, encoder_attention_type="local",
                   local_radius=4),
    "switch_transformers": s2s("SwitchTransformersConfig", "SwitchTransformersForConditionalGeneration", **T5,
                               num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, num_experts=4,
                               expert_capacity=8),
    "bart": s2s("BartConfig", "BartForConditionalGeneration", **BART),
    "mbart": s2s("MBartConfig", "MBartForConditionalGeneration", **BART),
    "pegasus": s2s("PegasusConfig", "PegasusForConditionalGeneration", **BART),
    "marian": s2s("MarianConfig", "MarianMTModel", **BART),
    "blenderbot": s2s("BlenderbotConfig", "BlenderbotForConditionalGeneration", **BART),
    "blenderbot_small": s2s("BlenderbotSmallConfig", "BlenderbotSmallForConditionalGeneration", **BART),
    "m2m100": s2s("M2M100Config", "M2M100ForConditionalGeneration", **BART),
    "plbart": s2s("PLBartConfig", "PLBartForConditionalGeneration", **BART),
    "mvp": s2s("MvpConfig", "MvpForConditionalGeneration", **BART),
    "led": s2s("LEDConfig", "LEDForConditionalGeneration", **{k: v for k, v in BART.items() if k != "max_position_embeddings"},
               max_encoder_position_embeddings=POS, max_decoder_position_embeddings=POS, attention_window=[4, 4]),
    "bigbird_pegasus": s2s("BigBirdPegasusConfig", "BigBirdPegasusForConditionalGeneration", **BART,
                           attention_type="original_full"),
    "pegasus_x": s2s("PegasusXConfig", "PegasusXForConditionalGeneration", **BART, num_global_tokens=4, block_size=4),
    "prophetnet": s2s("ProphetNetConfig", "ProphetNetForConditionalGeneration", vocab_size=VOCAB, hidden_size=32,
                      encoder_ffn_dim=64, decoder_ffn_dim=64, num_encoder_layers=2, num_decoder_layers=2,
                      num_encoder_attention_heads=2, num_decoder_attention_heads=2, max_position_embeddings=POS,
                      ngram=2, num_buckets=8, relative_max_distance=16, **IDS),
    "fsmt": s2s("FSMTConfig", "FSMTForConditionalGeneration", langs=["en", "de"], src_vocab_size=VOCAB,
                tgt_vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=POS, **IDS),
}

factories(SPECS, globals())
