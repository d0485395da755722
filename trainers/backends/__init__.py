"""The model back ends, one module each (hf.py, vllm.py, openai.py), what they share (common.py) and constrained
replies (choices.py). Callers import them through trainers/models.py, which picks one."""
