"""Transformers text architectures: causal LM, masked LM and sequence classification heads,
each from its config class with tiny sizes, trained through ``hf_setup`` with the collator a
Trainer script uses (DataCollatorForLanguageModeling, DataCollatorWithPadding)."""

from __future__ import annotations

from zoo_common import VOCAB, factories

IDS = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3)
POS = 64
LLAMA = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=POS, **IDS)
BERT = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=POS, pad_token_id=0)
MOE = dict(num_experts_per_tok=2)


def clm(cfg: str, cls: str, **kw) -> dict:
    return {"config": (cfg, kw), "model": cls, "task": "clm", "head": "causal LM"}


def mlm(cfg: str, cls: str, **kw) -> dict:
    return {"config": (cfg, kw), "model": cls, "task": "mlm", "head": "masked LM"}


def seqcls(cfg: str, cls: str, **kw) -> dict:
    return {"config": (cfg, dict(num_labels=3, **kw)), "model": cls, "task": "seqcls", "head": "sequence classification"}


SPECS = {
    # causal LM
    "gpt2": clm("GPT2Config", "GPT2LMHeadModel", vocab_size=VOCAB, n_positions=POS, n_embd=32, n_layer=2, n_head=2, **IDS),
    "gpt_neo": clm("GPTNeoConfig", "GPTNeoForCausalLM", vocab_size=VOCAB, max_position_embeddings=POS, hidden_size=32,
                   num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]], window_size=8, **IDS),
    "gpt_neox": clm("GPTNeoXConfig", "GPTNeoXForCausalLM", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=64, max_position_embeddings=POS, **IDS),
    "gptj": clm("GPTJConfig", "GPTJForCausalLM", vocab_size=VOCAB, n_positions=POS, n_embd=32, n_layer=2, n_head=2,
                rotary_dim=8, **IDS),
    "opt": clm("OPTConfig", "OPTForCausalLM", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, ffn_dim=64,
               num_attention_heads=2, max_position_embeddings=POS, word_embed_proj_dim=32, **IDS),
    "bloom": clm("BloomConfig", "BloomForCausalLM", vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=2, **IDS),
    "llama": clm("LlamaConfig", "LlamaForCausalLM", **LLAMA),
    "mistral": clm("MistralConfig", "MistralForCausalLM", **LLAMA, sliding_window=8),
    "mixtral": clm("MixtralConfig", "MixtralForCausalLM", **LLAMA, num_local_experts=4, **MOE),
    "qwen2": clm("Qwen2Config", "Qwen2ForCausalLM", **LLAMA),
    "qwen2_moe": clm("Qwen2MoeConfig", "Qwen2MoeForCausalLM", **LLAMA, num_experts=4, moe_intermediate_size=32,
                     shared_expert_intermediate_size=32, **MOE),
    "qwen3": clm("Qwen3Config", "Qwen3ForCausalLM", **LLAMA, head_dim=8),
    "gemma": clm("GemmaConfig", "GemmaForCausalLM", **LLAMA, head_dim=8),
    "gemma2": clm("Gemma2Config", "Gemma2ForCausalLM", **LLAMA, head_dim=8, sliding_window=8),
    "phi": clm("PhiConfig", "PhiForCausalLM", **LLAMA),
    "phi3": clm("Phi3Config", "Phi3ForCausalLM", **LLAMA),
    "falcon": clm("FalconConfig", "FalconForCausalLM", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=4, **IDS),
    # CodeGen splits its heads over 4 (mp_num): n_head must be a multiple of 4
    "codegen": clm("CodeGenConfig", "CodeGenForCausalLM", vocab_size=VOCAB, n_positions=POS, n_ctx=POS, n_embd=32,
                   n_layer=2, n_head=4, rotary_dim=4, **IDS),
    "stablelm": clm("StableLmConfig", "StableLmForCausalLM", **LLAMA),
    "starcoder2": clm("Starcoder2Config", "Starcoder2ForCausalLM", **LLAMA),
    "olmo": clm("OlmoConfig", "OlmoForCausalLM", **LLAMA),
    "olmo2": clm("Olmo2Config", "Olmo2ForCausalLM", **LLAMA),
    "granite": clm("GraniteConfig", "GraniteForCausalLM", **LLAMA),
    "cohere": clm("CohereConfig", "CohereForCausalLM", **LLAMA),
    "gpt_bigcode": clm("GPTBigCodeConfig", "GPTBigCodeForCausalLM", vocab_size=VOCAB, n_positions=POS, n_embd=32,
                       n_layer=2, n_head=2, **IDS),
    "biogpt": clm("BioGptConfig", "BioGptForCausalLM", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                  num_attention_heads=2, intermediate_size=64, max_position_embeddings=POS, **IDS),
    "xglm": clm("XGLMConfig", "XGLMForCausalLM", vocab_size=VOCAB, max_position_embeddings=POS, d_model=32, ffn_dim=64,
                num_layers=2, attention_heads=2, **IDS),
    "mpt": clm("MptConfig", "MptForCausalLM", vocab_size=VOCAB, d_model=32, n_heads=2, n_layers=2, max_seq_len=POS, **IDS),
    "persimmon": clm("PersimmonConfig", "PersimmonForCausalLM", vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                     num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=POS, **IDS),
    "mamba": clm("MambaConfig", "MambaForCausalLM", vocab_size=VOCAB, hidden_size=32, state_size=8,
                 num_hidden_layers=2, expand=2, conv_kernel=4, **IDS),
    "rwkv": clm("RwkvConfig", "RwkvForCausalLM", vocab_size=VOCAB, context_length=POS, hidden_size=32,
                num_hidden_layers=2, attention_hidden_size=32, intermediate_size=64, **IDS),
    "openai_gpt": clm("OpenAIGPTConfig", "OpenAIGPTLMHeadModel", vocab_size=VOCAB, n_positions=POS, n_embd=32,
                      n_layer=2, n_head=2),
    "ctrl": clm("CTRLConfig", "CTRLLMHeadModel", vocab_size=VOCAB, n_positions=POS, n_embd=32, dff=64, n_layer=2,
                n_head=2),
    "xlnet": clm("XLNetConfig", "XLNetLMHeadModel", vocab_size=VOCAB, d_model=32, n_layer=2, n_head=2, d_inner=64, **IDS),
    # masked LM
    "bert": mlm("BertConfig", "BertForMaskedLM", **BERT),
    "roberta": mlm("RobertaConfig", "RobertaForMaskedLM", **{**BERT, "max_position_embeddings": POS + 2}),
    "xlm_roberta": mlm("XLMRobertaConfig", "XLMRobertaForMaskedLM", **{**BERT, "max_position_embeddings": POS + 2}),
    "distilbert": mlm("DistilBertConfig", "DistilBertForMaskedLM", vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2,
                      hidden_dim=64, max_position_embeddings=POS, pad_token_id=0),
    "albert": mlm("AlbertConfig", "AlbertForMaskedLM", **BERT, embedding_size=16),
    "electra": mlm("ElectraConfig", "ElectraForMaskedLM", **BERT, embedding_size=32),
    "deberta": mlm("DebertaConfig", "DebertaForMaskedLM", **BERT),
    "deberta_v2": mlm("DebertaV2Config", "DebertaV2ForMaskedLM", **BERT),
    "convbert": mlm("ConvBertConfig", "ConvBertForMaskedLM", **BERT, embedding_size=32, conv_kernel_size=3),
    "roformer": mlm("RoFormerConfig", "RoFormerForMaskedLM", **BERT, embedding_size=32),
    "megatron_bert": mlm("MegatronBertConfig", "MegatronBertForMaskedLM", **BERT),
    "ernie": mlm("ErnieConfig", "ErnieForMaskedLM", **BERT),
    "data2vec_text": mlm("Data2VecTextConfig", "Data2VecTextForMaskedLM", **{**BERT, "max_position_embeddings": POS + 2}),
    "mpnet": mlm("MPNetConfig", "MPNetForMaskedLM", **{**BERT, "max_position_embeddings": POS + 2}),
    "funnel": mlm("FunnelConfig", "FunnelForMaskedLM", vocab_size=VOCAB, block_sizes=[1, 1], d_model=32, n_head=2,
                  d_head=16, d_inner=64, pad_token_id=0),
    "squeezebert": mlm("SqueezeBertConfig", "SqueezeBertForMaskedLM", **BERT, embedding_size=32),
    "modernbert": mlm("ModernBertConfig", "ModernBertForMaskedLM", vocab_size=VOCAB, hidden_size=32,
                      intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, max_position_embeddings=POS,
                      local_attention=8, pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3),
    "esm": mlm("EsmConfig", "EsmForMaskedLM", **{**BERT, "max_position_embeddings": POS + 2}, mask_token_id=4),
    "fnet": mlm("FNetConfig", "FNetForMaskedLM", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2,
                intermediate_size=64, max_position_embeddings=POS, pad_token_id=0),
    # sequence classification
    "gpt2_cls": seqcls("GPT2Config", "GPT2ForSequenceClassification", vocab_size=VOCAB, n_positions=POS, n_embd=32,
                       n_layer=2, n_head=2, **IDS),
    "llama_cls": seqcls("LlamaConfig", "LlamaForSequenceClassification", **LLAMA),
    "bert_cls": seqcls("BertConfig", "BertForSequenceClassification", **BERT),
    "xlnet_cls": seqcls("XLNetConfig", "XLNetForSequenceClassification", vocab_size=VOCAB, d_model=32, n_layer=2,
                        n_head=2, d_inner=64, **IDS),
    "longformer_cls": seqcls("LongformerConfig", "LongformerForSequenceClassification",
                             **{**BERT, "max_position_embeddings": POS + 2}, attention_window=[4, 4]),
    "big_bird_cls": seqcls("BigBirdConfig", "BigBirdForSequenceClassification", **BERT, attention_type="original_full"),
    "canine_cls": seqcls("CanineConfig", "CanineForSequenceClassification", hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64, max_position_embeddings=POS * 4,
                         downsampling_rate=2, num_hash_buckets=64, pad_token_id=0),
}

factories(SPECS, globals())
