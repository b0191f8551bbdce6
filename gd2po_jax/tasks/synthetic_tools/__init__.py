"""The embedded default task: a generated tool-calling world in the ToolRL format (`data`, `world`),
its registration (`task`), and what RL did to the demonstrations' habit (`habits`)."""
