"""Vigil's reference VLM: a small LLaVA-architecture model trained here on a benchmark's train
split, saved in Hugging Face format and served by the ``hf`` backend like any other model."""
