"""Training's shared parts, below the tasks and the RL core: the records a training step carries
(`records`: TrainState, RolloutBatch), the optimizer (`optimizer`), the seeded row batches of
supervised training (`batches`), and the training of Bradley-Terry reward models (`reward_models`),
which the tasks that score with reward models build before RL.

May import: errors, config, runtime, models, data, rewards.
"""
