"""The main job behind ``goodput demo``: a small transformer language model, its corpus and training script."""
