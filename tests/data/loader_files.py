"""What the loader tests read: the data files (tiny, or the real public ones) and what each holds
(`EXPECTED`, for the ``files`` fixture of tests/data/conftest.py), and helpers that write JSONL files."""

import dataclasses
import pathlib

from tests import fixture_data
from tests.fakes import data_files


@dataclasses.dataclass(frozen=True)
class Expected:
    """What a data directory's files hold."""

    rlla_rows: int
    rlla_tool_calls: int  # RLLA rows whose ground truth has a <tool_call>
    rlla_first_call: str  # in the first row's ground truth
    rlla_first_user: str  # in the first row's user message
    system_prefix: str  # how the tool-calling system messages begin
    sft_rows: int
    sft_first_user: str  # in the first SFT record's user message
    api_bank_rows: dict  # level -> rows
    api_bank_first: dict  # level -> the first row's answer, as a list of calls
    alpaca_rows: int
    alpaca_first: str  # how the first Alpaca prompt begins


EXPECTED = {
    "tiny": Expected(
        rlla_rows=fixture_data.ROWS["rlla_4k/test.parquet"],
        rlla_tool_calls=sum("<tool_call>" in r["reward_model"]["ground_truth"] for r in fixture_data.rlla_rows()),
        rlla_first_call='"name": "GetNews"', rlla_first_user="Azure", system_prefix=fixture_data.SYSTEM_PREFIX,
        sft_rows=fixture_data.ROWS["rlla_4k/rlla_sft.json"], sft_first_user="LH 402",
        api_bank_rows={level: fixture_data.ROWS[f"api_bank/level-{level}-api_processed.json"] for level in (1, 2, 3)},
        api_bank_first={1: [{"name": "FlightStatus", "parameters": {"flight_number": "LH402", "date": "2024-03-26"}}],
                        2: [{"name": "GetNews", "parameters": {"page": 1, "topic": "Google Cloud"}}]},
        alpaca_rows=fixture_data.ROWS["safe_alignment/alpaca_test.parquet"],
        alpaca_first="Describe a time when a small act of kindness",
    ),
    "real": Expected(
        rlla_rows=80, rlla_tool_calls=71, rlla_first_call='"name": "GetNews"', rlla_first_user="Azure",
        system_prefix="You are a helpful multi-turn dialogue assistant", sft_rows=400, sft_first_user="Alex Ferguson",
        api_bank_rows={1: 399, 2: 67, 3: 131},
        api_bank_first={1: [{"name": "ModifyRegistration",
                             "parameters": {"appointment_id": "34567890", "new_appointment_date": "2023-03-26",
                                            "new_appointment_doctor": "Dr. Lee"}}],
                        2: [{"name": "SymptomSearch", "parameters": {"symptom": "rash"}}]},
        alpaca_rows=512, alpaca_first="Describe an example of a time you used influence",
    ),
}


def rlla_parquet() -> pathlib.Path:
    """The tiny verl parquet file."""
    return data_files() / "rlla_4k" / "test.parquet"


def api_bank_file(level: int) -> pathlib.Path:
    """The tiny API-Bank file of ``level``."""
    return data_files() / "api_bank" / f"level-{level}-api_processed.json"


JSONL_ROWS = [
    {
        "prompt": "What is the weather in Paris?",
        "ground_truth": "<think> t </think>\n<response> sunny </response>",
    },
    {
        "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}],
        "target": "hello",
        "level": 2,
    },
    {"prompt": [{"role": "user", "content": "x"}], "source": "mine", "extra": [1, 2]},
]


def write_jsonl(path, lines):
    """``lines`` written to ``path``, one a line; returns ``path``."""
    path.write_text("\n".join(lines) + "\n")
    return path
