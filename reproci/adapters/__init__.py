"""Adapters: a model as its library trains it, turned into a ``TrainSetup`` in one call.

- ``reproci.adapters.hf.hf_setup``: a Hugging Face model, its dataset and collator, and the
  ``TrainingArguments`` knobs that change results.
- ``reproci.adapters.lightning.lightning_setup``: a ``LightningModule`` as it is.

They run in the worker, inside the image: each imports only the standard library, torch,
numpy, ``reproci.worker`` and its own library (there, with the model it adapts). This file
imports nothing, so the orchestrator never needs either library. Each library family is an
extra of the package: ``pip install 'reproci[hf]'`` (transformers, accelerate) and
``pip install 'reproci[lightning]'`` (pytorch-lightning); where one is missing, importing an
adapter fails and the worker says in one line what to install (``contract.load_factory``).
"""
