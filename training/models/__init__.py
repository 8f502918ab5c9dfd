"""The trainer's models: the decoder (Llama and Qwen2 under Hugging Face's names), LoRA layers and a
random checkpoint writer."""
