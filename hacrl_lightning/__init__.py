"""hacrl_lightning: N heterogeneous LLM agents trained together with RL (HACPO) on PyTorch Lightning."""
