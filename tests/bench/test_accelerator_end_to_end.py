"""bench/accelerator/end_to_end.py: part 4 of the accelerator check reads the README's table that a
device run's numbers are set beside. (The part itself runs in the CPU smoke: test_accelerator_check.py.)"""

import pytest

from bench.accelerator import end_to_end
from tests.fakes import REPO


def test_part_4_reads_the_readme_table_it_is_compared_with(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("| validation | after warm start | after 40 RL steps |\n|---|---|---|\n"
                      "| Correct Acc | 0.227 | **0.406** |\n| ... one-call requests | 0.131 (11) | 0.405 (34) |\n"
                      "| Format Acc | 0.875 | 0.891 |\n| Truncation rate | 0.000 | 0.008 |\n")
    assert end_to_end.readme_default_table(readme) == {
        "correct_acc": {"before_rl": 0.227, "after_rl": 0.406},
        "format_acc": {"before_rl": 0.875, "after_rl": 0.891},
        "truncation_rate": {"before_rl": 0.0, "after_rl": 0.008}}
    readme.write_text("| Correct Acc | 0.227 | 0.406 |\n| Format Acc | 0.875 | n/a |\n")
    with pytest.raises(ValueError, match="Format Acc"):
        end_to_end.readme_default_table(readme)
    # The repository's README has the table (what a device run sets beside its own numbers).
    table = end_to_end.readme_default_table(REPO / "README.md")
    assert 0 <= table["correct_acc"]["before_rl"] < table["correct_acc"]["after_rl"] <= 1
