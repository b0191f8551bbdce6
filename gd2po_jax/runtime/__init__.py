"""What a run stands on: its workdir (lock, atomic writes, config.json: `run_dir`), checkpoints,
several hosts (`distributed`), preemption, sharding, host memory, objects named by import path
(`imports`), Hub ids (`hub`) and metrics logging (metrics.jsonl, TensorBoard, Weights & Biases).

May import: errors, config.
"""
