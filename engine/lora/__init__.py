"""LoRA adapters served beside the base model (`ninfer serve --lora NAME=PATH`)."""
