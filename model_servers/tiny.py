"""A tiny LLaVA-architecture model with random weights, built locally for tests and demos.

Nothing is downloaded: the tokenizer is trained here on a few dozen sentences that hold the words
of Vigil's prompts, the vision tower is a 2-layer CLIP on 32x32 images and the language model a
2-layer Llama. It loads through ``AutoModelForImageTextToText`` / ``AutoProcessor`` like any
Hugging Face VLM and generates 32 tokens in a few tens of milliseconds on CPU. Its answers are
noise; it exists to exercise the ``hf`` backend end to end.
"""

from __future__ import annotations

import os
import shutil
import string
import tempfile
from pathlib import Path

IMAGE_SIZE = 32
PATCH_SIZE = 8
IMAGE_TOKEN = "<image>"
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", IMAGE_TOKEN]
REQUIRED_FILES = ("config.json", "model.safetensors", "processor_config.json", "tokenizer.json")

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}USER: {% else %}ASSISTANT: {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for item in message['content'] %}"
    "{% if item['type'] == 'image' %}{{ '<image>\\n' }}"
    "{% elif item['type'] == 'text' %}{{ item['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% if message['role'] == 'user' %}{{ '\\n' }}{% else %}{{ eos_token + '\\n' }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

CORPUS = [
    "USER: What is the imaging plane of this brain MRI slice?",
    "Options: A. axial B. coronal C. sagittal",
    "A. axial",
    "B) coronal",
    "C. sagittal",
    "Which MRI sequence is shown? T1, T1ce, T2, FLAIR, PD, MRA, DWI.",
    "Is this a brain MRI? Answer yes or no.",
    "Is a tumor visible in this slice? yes no",
    "Which side is the lesion on? left right bilateral none",
    "Answer with the letter of the correct option, then your confidence from 0 to 100.",
    "If you cannot tell, answer UNSURE.",
    "ASSISTANT: Answer: A",
    "Answer: B",
    "Answer: C",
    "Answer: D",
    "Answer: E",
    "Answer: F",
    "Answer: G",
    "Answer: UNSURE",
    "Confidence: 0",
    "Confidence: 47",
    "Confidence: 80",
    "Confidence: 95",
    "Confidence: 100",
    "The image shows an axial T2 weighted slice of the brain.",
    "The image shows a coronal FLAIR slice with a bright lesion on the left.",
    "The image shows a sagittal T1 slice; no tumor is visible.",
    "This is not a brain MRI; it is a chest X-ray.",
    "Which modality is this? CT, X-ray, MRI, ultrasound.",
    "Which organ is shown? brain, chest, heart, lungs, breast.",
    "What is the most likely diagnosis? Describe the abnormality.",
    "The finding is in the right hemisphere near the ventricle.",
    "0 1 2 3 4 5 6 7 8 9 10 25 50 75 90 99",
    "A B C D E F G",
    string.printable.replace("\x0b", "").replace("\x0c", ""),
]


def train_tokenizer(
    corpus: list[str] | None = None, vocab_size: int = 512
):  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS if corpus is None else corpus, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )


def image_processor(size: int = IMAGE_SIZE):  # -> a CLIP image processor
    try:  # transformers 5 without torchvision: the PIL processor, without a fallback warning
        from transformers import CLIPImageProcessorPil as Processor
    except ImportError:  # pragma: no cover - older transformers
        from transformers import CLIPImageProcessor as Processor  # type: ignore[assignment]

    return Processor(
        size={"shortest_edge": size},
        crop_size={"height": size, "width": size},
        do_center_crop=True,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
    )


def build_tiny_llava(path: Path, seed: int = 0) -> Path:
    """Write a tiny random-weight LLaVA model and its processor to ``path``; the same seed gives
    the same files. ``path`` may exist; files in it are overwritten."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import (
        CLIPVisionConfig,
        LlamaConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    tokenizer = train_tokenizer()
    processor = LlavaProcessor(
        image_processor=image_processor(),
        tokenizer=tokenizer,
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped again by "default"
        chat_template=CHAT_TEMPLATE,
    )
    vision = CLIPVisionConfig(
        image_size=IMAGE_SIZE,
        patch_size=PATCH_SIZE,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        projection_dim=32,
    )
    text = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    config = LlavaConfig(
        vision_config=vision,
        text_config=text,
        image_token_index=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        image_seq_length=(IMAGE_SIZE // PATCH_SIZE) ** 2,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config).eval()
    model.generation_config.do_sample = False
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def is_complete(path: Path) -> bool:
    """Whether ``path`` holds every file a built tiny model has."""
    return all((Path(path) / name).is_file() for name in REQUIRED_FILES)


def ensure_tiny_llava(path: Path, seed: int = 0) -> Path:
    """``path`` if it already holds a model, else build one there.

    The model is built in a sibling temporary folder and renamed into place, so a crash never
    leaves half a model at ``path``, and two builders racing end with one complete copy.
    """
    path = Path(path)
    if is_complete(path):
        return path
    if path.exists() and any(path.iterdir()):
        raise FileExistsError(f"{path} exists, is not empty, and holds no complete model")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", dir=path.parent))
    try:
        build_tiny_llava(tmp, seed=seed)
        if path.exists():
            path.rmdir()  # empty, checked above
        os.rename(tmp, path)
    except OSError:
        if is_complete(path):  # another builder won the race
            return path
        raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return path
