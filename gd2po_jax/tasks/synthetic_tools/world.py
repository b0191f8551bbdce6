"""The tools of the synthetic tool-calling task: typed parameters, vocabularies and phrasings.

Pure data plus two small classes; `gd2po_jax.tasks.synthetic_tools.data` draws requests from it.
Every parameter takes its values from a small vocabulary, so a request names each value exactly
and the right call is determined by the request text. Values are JSON scalars: strings, ints,
floats and booleans.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class Param:
    """One typed tool parameter.

    Attributes:
      name: the JSON key.
      kind: JSON-schema type: "string", "integer", "number" or "boolean".
      values: the values a request may use (a small vocabulary).
      surface: how a value reads in a request (default: `str(value)`).
      enum: whether the schema lists `values` as an enum.
    """

    name: str
    kind: str
    values: tuple[Any, ...]
    surface: Mapping[Any, str] | None = None
    enum: bool = False

    def schema(self) -> dict[str, Any]:
        """{"enum": values} for enum parameters (the values carry the type), else {"type": kind}."""
        return {"enum": list(self.values)} if self.enum else {"type": self.kind}

    def say(self, value: Any) -> str:
        """The text of `value` in a user request."""
        return self.surface[value] if self.surface is not None else str(value)


@dataclasses.dataclass(frozen=True)
class Tool:
    """A tool: schema, the request phrasings that need it, and what it does in words.

    Attributes:
      name: the tool name the call must use.
      description: one sentence for the system prompt.
      need: a verb phrase for reasoning and refusals ("check the weather"); unique per tool.
      params: the parameters; every request gives all of them.
      templates: request phrasings with one `{param}` slot per parameter.
      distinct: parameters that must take different values (e.g. origin and destination).
      family: tools of one family can serve each other's requests, so a request is never
        declared unservable while a tool of its family is listed.
    """

    name: str
    description: str
    need: str
    params: tuple[Param, ...]
    templates: tuple[str, ...]
    distinct: tuple[str, ...] = ()
    family: str = ""

    def schema_text(self) -> str:
        """The tool's parameters as one line of JSON, as the ToolRL prompts list them."""
        return json.dumps({p.name: p.schema() for p in self.params})


def _p(name: str, kind: str, values: Iterable[Any]) -> Param:
    return Param(name, kind, tuple(values))


def _s(name: str, values: Iterable[str]) -> Param:
    return Param(name, "string", tuple(values))


def _i(name: str, values: Iterable[int]) -> Param:
    return Param(name, "integer", tuple(values))


def _enum(name: str, values: Iterable[Any], surface: Mapping[Any, str] | None = None) -> Param:
    values = tuple(values)
    kind = "integer" if all(isinstance(v, int) for v in values) else "string"
    return Param(name, kind, values, surface, enum=True)


def _flag(name: str, yes: str, no: str) -> Param:
    return Param(name, "boolean", (True, False), {True: yes, False: no})


CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Rome", "Seoul", "Austin", "Dublin",
          "Nairobi", "Madrid", "Sydney", "Toronto", "Berlin", "Mumbai", "Denver")  # fmt: skip
MONTHS = ("March", "April", "May", "June", "July", "August")
DATES = tuple(f"{m} {d}" for m in MONTHS for d in (2, 5, 9, 14, 18, 23, 27))
NAMES = ("Alice", "Bob", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jamal")
LANGUAGES = ("French", "Spanish", "German", "Japanese", "Italian", "Korean")
CURRENCIES = ("USD", "EUR", "JPY", "GBP", "CAD", "INR")
PLACES = ("the airport", "the museum", "the station", "city hall", "the beach", "the stadium")
ROOMS = ("kitchen", "bedroom", "office", "living room")
DISHES = ("pancakes", "lasagna", "curry", "tacos", "risotto", "falafel")

_CITY, _DATE = _s("city", CITIES), _s("date", DATES)

# fmt: off
TOOLS: tuple[Tool, ...] = (
    Tool("get_weather", "Weather forecast for a city.", "check the weather",
         (_CITY, _enum("unit", ("celsius", "fahrenheit"))),
         ("What's the weather in {city} in {unit}?", "Give me the {city} forecast in {unit}.",
          "How warm is it in {city}? Use {unit}.")),
    Tool("get_local_time", "Current local time in a city.", "tell the local time", (_CITY,),
         ("What time is it in {city}?", "Tell me the current time in {city}.",
          "I need the local time for {city}.")),
    Tool("convert_currency", "Convert an amount of money.", "convert money",
         (_i("amount", (20, 50, 75, 100, 250, 500)), _s("from_currency", CURRENCIES),
          _s("to_currency", CURRENCIES)),
         ("Convert {amount} {from_currency} to {to_currency}.",
          "How much is {amount} {from_currency} in {to_currency}?"),
         distinct=("from_currency", "to_currency"), family="currency"),
    Tool("get_exchange_rate", "Exchange rate between two currencies.", "get an exchange rate",
         (_s("base", CURRENCIES), _s("quote", CURRENCIES)),
         ("What is the {base} to {quote} exchange rate?", "Show the rate from {base} to {quote}."),
         distinct=("base", "quote"), family="currency"),
    Tool("book_hotel", "Book a hotel room.", "book a hotel",
         (_CITY, _i("nights", range(2, 10)),
          _flag("breakfast", "with breakfast", "without breakfast")),
         ("Book a hotel in {city} for {nights} nights {breakfast}.",
          "I need a room in {city}, {nights} nights, {breakfast}.")),
    Tool("book_flight", "Book a flight between two cities.", "book a flight",
         (_s("origin", CITIES), _s("destination", CITIES), _DATE),
         ("Book a flight from {origin} to {destination} on {date}.",
          "Fly me from {origin} to {destination} on {date}."),
         distinct=("origin", "destination")),
    Tool("find_restaurant", "Find restaurants by cuisine.", "find a restaurant",
         (_CITY, _enum("cuisine", ("italian", "thai", "mexican", "indian", "greek"))),
         ("Find a {cuisine} restaurant in {city}.", "Where can I eat {cuisine} food in {city}?")),
    Tool("translate_text", "Translate a short text.", "translate text",
         (_s("text", ("good morning", "thank you", "see you soon", "happy birthday",
                      "where is the station")),
          _s("language", LANGUAGES)),
         ("Translate '{text}' into {language}.", "How do you say '{text}' in {language}?")),
    Tool("set_alarm", "Set an alarm.", "set an alarm",
         (_i("hour", range(5, 10)),
          _enum("minute", (0, 15, 30, 45), {0: "00", 15: "15", 30: "30", 45: "45"})),
         ("Set an alarm for {hour}:{minute} am.", "Wake me up at {hour}:{minute}.")),
    Tool("set_timer", "Start a countdown timer.", "start a timer",
         (_i("minutes", (3, 5, 10, 12, 20, 25, 40)),),
         ("Set a timer for {minutes} minutes.", "Start a {minutes} minute timer.")),
    Tool("play_music", "Play music by genre.", "play music",
         (_enum("genre", ("jazz", "rock", "pop", "classical", "blues")),
          _flag("shuffle", "on shuffle", "in order")),
         ("Play some {genre} music {shuffle}.", "Put on {genre} {shuffle}, please.")),
    Tool("send_email", "Send an email.", "send an email",
         (_s("recipient", NAMES),
          _s("subject", ("the budget", "the trip", "the report", "lunch plans"))),
         ("Email {recipient} about {subject}.", "Send {recipient} an email about {subject}.")),
    Tool("send_message", "Send a text message.", "send a text message",
         (_s("contact", NAMES),
          _s("text", ("running late", "call me back", "on my way", "see you at noon"))),
         ("Text {contact}: {text}.", "Send a message to {contact} saying {text}.")),
    Tool("create_event", "Add a calendar event.", "add a calendar event",
         (_s("title", ("team lunch", "yoga class", "dentist visit", "book club")), _DATE),
         ("Add {title} to my calendar on {date}.", "Put {title} in my calendar for {date}.")),
    Tool("add_todo", "Add a to-do item.", "add a to-do item",
         (_s("task", ("buy milk", "call the bank", "pay rent", "water the plants")),
          _enum("priority", ("low", "medium", "high"))),
         ("Add {task} to my to-do list with {priority} priority.",
          "Remind me to {task}, {priority} priority.")),
    Tool("search_news", "Search news headlines.", "find news",
         (_enum("topic", ("sports", "science", "politics", "health", "travel")),
          _i("count", (3, 5, 10))),
         ("Show me {count} {topic} headlines.",
          "Find the top {count} news stories about {topic}.")),
    Tool("get_stock_price", "Latest stock price.", "get a stock price",
         (_s("symbol", ("AAPL", "MSFT", "TSLA", "AMZN", "NVDA")),),
         ("What is {symbol} trading at?", "Get the stock price of {symbol}.")),
    Tool("calculate_tip", "Compute a restaurant tip.", "compute a tip",
         (_i("bill", (20, 35, 48, 60, 85)), _i("percent", (10, 15, 18, 20))),
         ("What's a {percent}% tip on a {bill} dollar bill?",
          "Calculate a {percent} percent tip for {bill} dollars.")),
    Tool("convert_distance", "Convert a distance between units.", "convert a distance",
         (_p("value", "number", (0.5, 1.5, 2.5, 3.5, 4.5, 6.5)),
          _enum("from_unit", ("km", "miles", "feet")), _enum("to_unit", ("km", "miles", "feet"))),
         ("Convert {value} {from_unit} to {to_unit}.",
          "How many {to_unit} is {value} {from_unit}?"),
         distinct=("from_unit", "to_unit")),
    Tool("get_directions", "Directions between two places.", "get directions",
         (_s("origin", PLACES), _s("destination", PLACES),
          _enum("mode", ("car", "foot", "bus"),
                {"car": "by car", "foot": "on foot", "bus": "by bus"})),
         ("How do I get from {origin} to {destination} {mode}?",
          "Directions from {origin} to {destination} {mode}, please."),
         distinct=("origin", "destination")),
    Tool("rent_car", "Rent a car.", "rent a car",
         (_CITY, _i("days", range(2, 8)), _enum("car_type", ("compact", "suv", "van"))),
         ("Rent a {car_type} in {city} for {days} days.",
          "I need a {car_type} in {city} for {days} days.")),
    Tool("order_food", "Order food for delivery.", "order food",
         (_s("dish", DISHES), _i("quantity", range(1, 5))),
         ("Order {quantity} portions of {dish}.",
          "I'd like {quantity} servings of {dish}, please.")),
    Tool("check_flight_status", "Status of a flight.", "check a flight",
         (_s("flight_number", ("AF12", "BA47", "LH90", "UA31", "JL8")),),
         ("Is flight {flight_number} on time?", "What's the status of flight {flight_number}?")),
    Tool("get_recipe", "Find a recipe.", "find a recipe",
         (_s("dish", DISHES), _i("servings", (2, 4, 6, 8))),
         ("Give me a {dish} recipe for {servings} people.",
          "How do I cook {dish} for {servings}?")),
    Tool("track_package", "Track a parcel.", "track a package",
         (_s("tracking_id", ("PK1001", "PK2047", "PK3310", "PK4782")),),
         ("Where is my package {tracking_id}?", "Track parcel {tracking_id}.")),
    Tool("set_thermostat", "Set a room temperature.", "set the thermostat",
         (_enum("room", ROOMS), _i("temperature", range(17, 26))),
         ("Set the {room} to {temperature} degrees.", "Make the {room} {temperature} degrees.")),
    Tool("turn_on_lights", "Turn on the lights.", "turn on the lights",
         (_enum("room", ROOMS), _i("brightness", (20, 40, 60, 80, 100))),
         ("Turn on the {room} lights at {brightness} percent.",
          "Lights on in the {room}, {brightness} percent.")),
    Tool("lock_door", "Lock a door.", "lock a door", (_enum("door", ("front", "back", "garage")),),
         ("Lock the {door} door.", "Please make sure the {door} door is locked.")),
    Tool("find_movie", "Recommend a movie.", "recommend a movie",
         (_enum("genre", ("comedy", "drama", "horror", "action")),
          _i("year", (1995, 2001, 2008, 2015, 2020))),
         ("Recommend a {genre} movie from {year}.", "Any good {genre} films from {year}?")),
    Tool("book_table", "Reserve a restaurant table.", "reserve a table",
         (_CITY, _i("people", range(2, 9)), _enum("time", ("6 pm", "7 pm", "8 pm"))),
         ("Reserve a table for {people} in {city} at {time}.",
          "Book dinner in {city} for {people} people at {time}.")),
    Tool("get_air_quality", "Air quality of a city.", "check the air quality", (_CITY,),
         ("How is the air quality in {city}?", "Is the air clean in {city} today?")),
    Tool("search_jobs", "Search job offers.", "search for jobs",
         (_s("title", ("nurse", "teacher", "chef", "designer")), _CITY,
          _flag("remote", "remote", "on-site")),
         ("Find {remote} {title} jobs in {city}.", "Any {remote} {title} openings in {city}?")),
    Tool("calculate_bmi", "Body mass index.", "compute a BMI",
         (_i("weight_kg", (55, 62, 70, 78, 85)), _i("height_cm", (160, 168, 175, 182, 190))),
         ("I weigh {weight_kg} kg and I am {height_cm} cm tall. What's my BMI?",
          "BMI for {weight_kg} kg at {height_cm} cm?")),
    Tool("get_population", "Population of a country.", "look up a population",
         (_s("country", ("Brazil", "Japan", "Kenya", "Canada", "Norway")),
          _i("year", (2000, 2010, 2020))),
         ("What was the population of {country} in {year}?",
          "How many people lived in {country} in {year}?")),
    Tool("define_word", "Dictionary definition.", "define a word",
         (_s("word", ("serendipity", "ephemeral", "resilient", "candid", "verbose")),),
         ("What does {word} mean?", "Define the word {word}.")),
    Tool("schedule_meeting", "Schedule a meeting.", "schedule a meeting",
         (_s("person", NAMES), _DATE, _enum("duration", (15, 30, 60))),
         ("Schedule a {duration} minute meeting with {person} on {date}.",
          "Set up {duration} minutes with {person} on {date}.")),
    Tool("get_sunrise", "Sunrise time for a city.", "find the sunrise time", (_CITY, _DATE),
         ("When is sunrise in {city} on {date}?",
          "What time does the sun rise in {city} on {date}?")),
    Tool("count_calories", "Calories in a food.", "count calories",
         (_s("food", ("apple", "rice", "bread", "cheese", "banana")),
          _i("grams", (50, 100, 150, 200))),
         ("How many calories are in {grams} grams of {food}?", "Calories in {grams} g of {food}?")),
)
# fmt: on

TOOLS_BY_NAME: dict[str, Tool] = {t.name: t for t in TOOLS}

GREETINGS = ("Hi", "Hello", "Hey there", "Good morning", "Good evening", "Hey")
INTRODUCTIONS = ("",) + tuple(f" I'm {n}." for n in NAMES)
SMALL_TALK = (
    ("How are you today?", "I am doing well, thanks for asking! How can I help you?"),
    ("What can you do?", "I can use the tools listed for me, or just chat with you."),
    ("Thanks for your help!", "You are welcome! Ask me anytime."),
    ("Who made you?", "I am a small assistant trained to call tools."),
    ("Tell me a joke.", "Why did the robot rest? It needed to recharge."),
    ("Do you like music?", "I like all kinds of music, though I cannot hear it."),
    ("What is your name?", "I am your tool assistant, happy to help."),
    ("Have a nice day!", "Thank you, you too!"),
    ("Are you a robot?", "I am an AI assistant, here to help you."),
    ("I'm bored.", "Maybe try a new recipe or some music? I can help with both."),
)
"""(question, reply) pairs of small talk: requests that need a plain response."""

FILLER = (
    "Other tools do not match.", "All needed values are in the request.",
    "I will use the listed tool.", "Let me check the parameters again.", "The request is clear.",
    "No extra details are needed.", "The values come from the user.",
    "I should keep the call simple.", "Each value has the right type.",
    "Nothing is missing.", "I compare the request with each tool.",
)  # fmt: skip
"""Sentences that lengthen a demonstration's reasoning without changing its answer."""
