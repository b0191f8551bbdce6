"""The embedded helpfulness-safety task: a generated assistant world (`world`) and its registration
with the reward models trained on it (`task`)."""
