"""Writes ``code-train.json`` (896 prompts) and ``code-heldout.json`` (48): code-heavy prompts of our own.

An exit head for a coder model learns best from what such a model writes most: code, much of it
repeated from the prompt. So besides requests to write functions, classes, scripts, SQL queries and
shell commands, many prompts embed a short snippet to fix, explain, refactor, annotate, test or
convert. Every template, task and snippet here was written for this set; none comes from Spec-Bench or
any other benchmark, which keeps those an honest measure of the head.

Each *unit* is one task under one operation (a function to write, a snippet to fix, ...) with all its
phrasings and languages as variants. Units are shuffled with a fixed seed and dealt round-robin, one
variant at a time, until the split is full, so every task appears about equally often. The held-out
units share no task or snippet with the training units. Run ``python make_code_prompts.py [OUT_DIR]``;
the output is the same on every run.
"""

from __future__ import annotations

import json
import random
import re
import sys
from pathlib import Path

SEED = 20241
TRAIN_SIZE = 896
HELDOUT_SIZE = 48
MAX_WORDS = 120
HERE = Path(__file__).resolve().parent

#: Language codes used in the task tables below; a code block's fence is the name in lower case.
LANG = dict(py="Python", js="JavaScript", ts="TypeScript", go="Go", rs="Rust", c="C", java="Java", sh="Bash")
LANG["sql"] = "SQL"

FUNCTION = (
    "Write a {L} function that {spec}.",
    "Implement a {L} function which {spec}. Show a short example of calling it.",
    "I need a function in {L} that {spec}. Can you write it and explain how it works?",
    "Write a {L} function that {spec}, and point out the edge cases it handles.",
)
FUNCTION_PY = (
    "Write a Python function that {spec}. Use type hints and add a docstring.",
    "Write a Python function that {spec}, along with a few pytest tests.",
)
CLASS = (
    "Write a {L} {kind} {name} that {spec}.",
    "Implement the {name} {kind} in {L}: it {spec}. Include a short usage example.",
    "Design a small {L} {kind} called {name} that {spec}. Document each method briefly.",
)
DATACLASS = (
    "Define a Python dataclass for {spec}.",
    "Using the dataclasses module, write {spec}. Show how to create one and print it.",
    "Write {spec} as a frozen Python dataclass, validating the fields in __post_init__.",
)
CLI = (
    "Write a Python command-line script using argparse that {spec}.",
    "Create a small Python CLI tool with argparse which {spec}. Include helpful --help text.",
    "Write a Python script with an argparse interface that {spec}. Exit with a non-zero status on errors.",
)
SQL = (
    "Given the tables {schema}, write a SQL query that {spec}.",
    "Tables: {schema}. Write a PostgreSQL query that {spec}, and explain how it works.",
    "Using SQLite with the tables {schema}, write a query that {spec}.",
)
CREATE = (
    "Write CREATE TABLE statements for {schema}, with primary keys, foreign keys and sensible types.",
    "Design the SQL tables {schema}: give the CREATE TABLE statements and explain the indexes you would add.",
)
SHELL = (
    "Give me a Bash one-liner to {spec}.",
    "How can I {spec} from a Linux shell?",
    "Write a shell command that will {spec}, and explain each part.",
    "Write a short Bash script to {spec}.",
)
TESTS = (
    "Write {fw} tests for a {L} function {sig} that {spec}. Cover the edge cases.",
    "I have a {L} function {sig} that {spec}. What tests would you write? Give them as {fw} code.",
    "Write table-driven or parametrized {fw} tests for {sig}, which {spec}.",
)
SNIPPET = {
    "explain": (
        "Explain what this {L} code does:\n\n{code}",
        "Walk me through this {L} snippet line by line:\n\n{code}",
        "What does the following {L} code do, and what would it give for a small example input?\n\n{code}",
    ),
    "fix": (
        "Fix the bug in this {L} code. It should {purpose}.\n\n{code}",
        "This {L} code {bug}. Find the bug and show the corrected version.\n\n{code}",
        "Here is {L} code meant to {purpose}, but it {bug}. What is wrong, and how do I fix it?\n\n{code}",
    ),
    "refactor": (
        "Refactor this {L} code to make it more readable without changing its behaviour:\n\n{code}",
        "Rewrite this {L} snippet in idiomatic {L}:\n\n{code}",
        "How would you simplify this {L} code? Show the refactored version.\n\n{code}",
    ),
    "hints": (
        "Add type hints to this Python code:\n\n{code}",
        "Add type hints and a docstring to this Python function:\n\n{code}",
        "Add Google-style docstrings to this code, which is meant to {purpose}:\n\n{code}",
    ),
    "tests": (
        "Write pytest tests for this function:\n\n{code}",
        "Write unit tests with the unittest module for this code, which should {purpose}:\n\n{code}",
    ),
    "convert": (
        "Convert this {L} code to {T}:\n\n{code}",
        "Translate this {L} code into idiomatic {T}, keeping the same behaviour:\n\n{code}",
    ),
}


def rows(table: str) -> list[list[str]]:
    """The fields of each line of a task table; fields are separated by " | ", "#" starts a comment."""
    return [line.split(" | ") for line in table.strip().splitlines() if line and not line.startswith("#")]


def functions(table: str) -> list[list[str]]:
    """One unit per function: every phrasing in every language listed for it."""
    units = []
    for spec, langs in rows(table):
        variants = [t.format(L=LANG[code], spec=spec) for code in langs.split() for t in FUNCTION]
        if "py" in langs.split():
            variants += [t.format(spec=spec) for t in FUNCTION_PY]
        units.append(variants)
    return units


def classes(table: str) -> list[list[str]]:
    kinds = {"go": "type", "rs": "struct", "c": "struct"}
    return [
        [
            t.format(L=LANG[c], kind=kinds.get(c, "class"), name=name, spec=spec)
            for c in langs.split()
            for t in CLASS
        ]
        for name, spec, langs in rows(table)
    ]


def filled(templates: tuple[str, ...], table: str) -> list[list[str]]:
    return [[t.format(spec=spec) for t in templates] for (spec,) in rows(table)]


def queries(table: str) -> list[list[str]]:
    """One unit per SQL question, plus one asking for the tables of each schema used."""
    pairs = rows(table)
    units = [[t.format(schema=SCHEMAS[key], spec=spec) for t in SQL] for key, spec in pairs]
    used = sorted({key for key, _ in pairs})
    return units + [[t.format(schema=SCHEMAS[key]) for t in CREATE] for key in used]


def tests(table: str) -> list[list[str]]:
    frameworks = {"py": "pytest", "ts": "Jest", "go": "Go testing"}
    return [
        [t.format(fw=frameworks[c], L=LANG[c], sig=sig, spec=spec) for t in TESTS]
        for c, sig, spec in rows(table)
    ]


def snippets(text: str) -> list[list[str]]:
    """Snippets follow a header ``@@ language | purpose | bug or - | languages to convert to, or -``.
    A buggy one gives a fix and an explain unit; a sound one explain, refactor and convert units,
    and for Python also type hints and tests."""
    units = []
    for block in text.split("\n@@ ")[1:]:
        header, _, code = block.partition("\n")
        lang, purpose, bug, targets = (field.strip("-") for field in header.split(" | "))
        code = code.strip("\n")
        if lang == "go":
            code = re.sub(r"(?m)^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), code)
        fenced, name = f"```{LANG[lang].lower()}\n{code}\n```", LANG[lang]
        ops = ["fix", "explain"] if bug else ["explain", "refactor"] + ["hints", "tests"] * (lang == "py")
        units += [
            [t.format(L=name, code=fenced, purpose=purpose, bug=bug) for t in SNIPPET[op]] for op in ops
        ]
        if targets and not bug:
            convert = SNIPPET["convert"]
            units.append([t.format(L=name, T=LANG[c], code=fenced) for c in targets.split() for t in convert])
    return units


def units(tasks: dict[str, str]) -> list[list[str]]:
    return (
        functions(tasks["functions"])
        + classes(tasks["classes"])
        + filled(DATACLASS, tasks["dataclasses"])
        + filled(CLI, tasks["cli"])
        + queries(tasks["sql"])
        + filled(SHELL, tasks["shell"])
        + tests(tasks["tests"])
        + snippets(tasks["snippets"])
    )


def deal(units: list[list[str]], size: int, rng: random.Random) -> list[str]:
    """``size`` distinct prompts, taken one variant per unit per round from shuffled units."""
    units = [rng.sample(unit, len(unit)) for unit in units]
    rng.shuffle(units)
    chosen: dict[str, None] = {}
    for depth in range(max(map(len, units))):
        for unit in units:
            if depth < len(unit) and len(chosen) < size:
                chosen.setdefault(unit[depth])
    if len(chosen) < size:
        raise ValueError(f"Only {len(chosen)} distinct prompts for a split of {size}: add tasks.")
    return list(chosen)


def build() -> tuple[list[str], list[str]]:
    """The training and held-out prompts, checked for length and for overlap."""
    rng = random.Random(SEED)
    train, heldout = deal(units(TRAIN), TRAIN_SIZE, rng), deal(units(HELDOUT), HELDOUT_SIZE, rng)
    too_long = [p[:60] for p in train + heldout if len(p.split()) > MAX_WORDS]
    if too_long or set(train) & set(heldout):
        raise ValueError(f"Prompts over {MAX_WORDS} words {too_long} or shared between the splits.")
    return train, heldout


def write(out_dir: str | Path) -> tuple[Path, Path]:
    """Writes both splits into ``out_dir``, one prompt a line, and returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "code-train.json", out_dir / "code-heldout.json"
    for path, prompts in zip(paths, build(), strict=True):
        path.write_text("[\n" + ",\n".join(json.dumps(p) for p in prompts) + "\n]\n", encoding="utf-8")
    return paths


# --- Tasks ----------------------------------------------------------------------------------------

SCHEMAS = {
    "staff": "employees(id, name, department_id, salary, hired_on) and departments(id, name)",
    "shop": "customers(id, name, country) and orders(id, customer_id, placed_at, total)",
    "library": "books(id, title, author_id, published_year), authors(id, name) and "
    "loans(book_id, member_id, loaned_on, returned_on)",
    "sensors": "sensors(id, location) and readings(sensor_id, taken_at, temperature)",
}

# Tasks of the training set.
TRAIN_FUNCTIONS = """
# strings
reverses the order of the words in a sentence, collapsing repeated spaces | py js go
converts a snake_case identifier to camelCase | py ts rs
checks whether two strings are anagrams of each other, ignoring case and spaces | py java c
compresses a string with run-length encoding, so 'aaabcc' becomes 'a3b1c2' | py go c
truncates a string to at most n characters, ending it with '...' when it was cut | py ts
counts how often each character occurs in a string and returns the counts as a map | py js
wraps a paragraph so that no line is longer than a given width, breaking only at spaces | py rs
checks that every (, [ and { in a string is closed in the right order | py java go
turns a title such as 'Hello, World! 2024' into a URL slug like 'hello-world-2024' | py js
masks all but the last four characters of a card number with '*' | py ts c
finds the first character in a string that does not repeat | py go java
# lists and dictionaries
splits a list into chunks of a given size, the last chunk possibly shorter | py js rs
groups (name, department) pairs into a dictionary from department to a sorted list of names | py
merges two dictionaries of counts, adding the values of keys present in both | py js
inverts a dictionary, mapping each value to the list of keys that had it | py ts
rotates an array k positions to the right in place | py c java
returns the elements that occur in exactly one of two lists, in their original order | py
transposes a matrix given as a list of rows | py go
returns the running totals of a list of numbers | py rs
looks up a dotted path such as 'db.host' in a nested dictionary, or a default if a key is missing | py ts
deduplicates a list of records by their 'id' field, keeping the last occurrence | py js
zips two lists into a dictionary, raising ValueError when their lengths differ | py
# parsing
parses a query string such as 'a=1&b=two&a=3' into a dictionary of lists | py go
parses a duration such as '1h30m15s' into a total number of seconds | py rs ts
reads key=value lines from a config text, skipping blank lines and lines starting with '#' | py c
evaluates an arithmetic expression with +, -, *, / and parentheses without using eval | py java
parses two semantic version strings such as '2.10.3' and compares them | py go rs
converts a Roman numeral such as 'MCMXCIV' to an integer | py js c
splits a CSV line into fields, honouring double-quoted fields that contain commas | py go
# recursion
generates all permutations of a list without using itertools | py js
returns all subsets of a list of distinct integers | py java
computes the nesting depth of a list such as [1, [2, [3]]] | py ts
solves the Tower of Hanoi for n discs and returns the list of moves | py c
prints every path in a directory tree recursively, indented by its depth | py go
computes x to the power n by repeated squaring | py rs c
# iterators and generators
yields every sliding window of size k over any iterable, as a generator | py
yields the lines of a large file in batches of 100, as a generator | py
interleaves several sequences, taking one item from each in turn until all are used up | py rs
lazily yields prime numbers forever, using an incremental sieve | py go
# files
reads a CSV file and returns the sum of a named numeric column, skipping empty cells | py go
writes a list of records to a JSON Lines file and reads them back | py ts
finds the largest file under a directory and returns its path and size | py go rs
copies a text file while replacing each tab with four spaces | py c
appends a timestamped line to a log file, creating the file if it does not exist | py java
counts the lines, words and bytes of a file, like the wc command | py c rs
# regular expressions
uses a regular expression to pull every hashtag out of a social media post | py js
validates an IPv4 address such as '192.168.0.1' with a regex and a range check | py go ts
extracts the date, level and message from log lines like '2024-03-01 12:00:05 ERROR disk full' | py java
replaces every run of whitespace in a string with a single space using a regular expression | py js
finds all Markdown links [text](url) in a document and returns (text, url) pairs | py ts
# dates and times
returns the number of working days between two dates, skipping Saturdays and Sundays | py java
takes a date string in YYYY-MM-DD form and returns the name of its weekday | py go js
returns the last day of a given month and year | py rs
formats a number of seconds as a friendly string such as '2 hours, 5 minutes' | py ts
converts a UTC timestamp to a given IANA time zone and formats it as ISO 8601 | py
computes a person's age in whole years from a birth date and today's date | py java
# sorting and searching
sorts a list of integers with insertion sort | py c go
sorts people records by last name, then by age from oldest to youngest | py java ts
sorts a list with merge sort, returning a new list | py rs c
finds, by binary search, the index of the first element not less than a target in a sorted list | py go
finds the peak of an array whose values first rise and then fall | py java
searches a matrix whose rows and columns are sorted for a value in O(rows + cols) time | py c
sorts strings by length, keeping the original order of strings of equal length | py js
sorts integers from 0 to 255 with counting sort | py c
# graphs
finds the shortest path between two nodes of an unweighted graph (an adjacency list) with BFS | py java go
finds the shortest distances from a source with Dijkstra's algorithm, given weighted edges | py rs
returns a topological order of tasks given their dependencies, failing on a cycle | py ts go
counts the islands of 1s in a grid of 0s and 1s | py java c
detects whether an undirected graph contains a cycle using union-find | py rs
checks whether a graph given as an adjacency list is bipartite | py js
# dynamic programming
returns the fewest coins needed to make an amount from given denominations | py go java
computes the Levenshtein edit distance between two strings | py rs c
solves the 0/1 knapsack problem for a list of (weight, value) items and a capacity | py java
returns the length of the longest strictly increasing subsequence of a list | py c go
counts the paths from top-left to bottom-right of a grid with obstacles, moving only right or down | py ts
finds the contiguous subarray with the largest sum and returns the sum and its bounds | py rs java
splits a string without spaces into dictionary words, returning one segmentation or None | py js
# small algorithms
checks a credit card number with the Luhn algorithm | py go c
builds the first n rows of Pascal's triangle | py js rs
reduces a fraction given as numerator and denominator to lowest terms | py java
rounds a price to the nearest 0.05 using decimal arithmetic | py java
checks whether a partly filled 9x9 Sudoku board breaks any rule | py ts java
# concurrency, decorators, context managers
fetches several URLs concurrently with asyncio and aiohttp and returns their status codes | py
retries another function up to n times with exponential backoff, written as a decorator | py ts
memoises a function of hashable arguments, as a decorator with a maximum cache size | py
debounces another function so that it runs only after calls stop for 300 ms | js ts
measures how long a block of code takes and logs it, written as a context manager | py
"""

TRAIN_CLASSES = """
LRUCache | keeps at most `capacity` items and evicts the least recently used one | py java go
MinStack | supports push, pop, top and get_min, all in constant time | py ts rs
BankAccount | supports deposits, withdrawals that refuse overdrafts, and a transaction history | py java ts
Matrix | supports addition, multiplication and transpose, with operator overloading where possible | py rs
RateLimiter | allows at most n calls in any sliding window of t seconds | py go
Trie | supports insert, exact search and listing every word with a given prefix | py java js
BinaryHeap | stores a min-heap in an array and offers push, pop and peek | py c go
Inventory | tracks item quantities, never goes below zero and reports items that need restocking | py ts
EventEmitter | lets callers subscribe to and unsubscribe from named events, and emit events | js ts py
Polynomial | stores coefficients, evaluates at a point and adds two polynomials | py java
RingBuffer | has a fixed capacity and overwrites the oldest item when full | py rs c
Graph | stores a directed graph with add_edge, neighbours and a depth-first traversal | py java
"""

TRAIN_DATACLASSES = """
an Invoice with a number, a customer and a list of line items, plus a total() method
a Temperature held in Celsius, with properties giving Fahrenheit and Kelvin
a Point3D with x, y and z, a distance_to method, and ordering by distance from the origin
a Book with title, author, year and tags, and a classmethod that builds one from a dict
an Employee with name, salary and an optional manager, plus a method listing every manager above them
a Money value holding cents and a currency code, which refuses to add two different currencies
"""

TRAIN_CLI = """
renames every file in a folder by adding a date prefix, with a --dry-run flag
prints the n largest files under a directory, with n given by --top
converts a CSV file to JSON, with options for the delimiter and the output path
searches a log file for a pattern and prints matching lines with their numbers, ignoring case with -i
reads URLs from a file and reports which ones do not answer with status 200, with a --timeout option
prints the SHA-256 checksum of each file given on the command line
splits a large text file into parts of at most N lines each
converts temperatures between Celsius and Fahrenheit, with a --to option and one or more values
"""

TRAIN_SQL = """
staff | returns each department's name and average salary, highest first
staff | lists the employees who earn more than the average salary of their own department
staff | finds the departments that have no employees
staff | returns the three most recently hired employees of each department, using a window function
staff | counts how many employees were hired in each year
shop | returns the ten customers who have spent the most in total
shop | lists the customers who have never placed an order
shop | computes the revenue of each month of 2023
shop | finds the customers whose first order was placed in the last 30 days
shop | returns, for each country, the number of customers and the average order total
library | lists the books currently on loan, with their authors
library | finds the five authors whose books were borrowed most often
library | returns members with more than three loans kept over 21 days and not yet returned
library | deletes the loans that were returned more than five years ago
"""

TRAIN_SHELL = """
find every .log file under /var/log older than seven days and delete it
count the lines of Python code in a project, leaving out the .venv folder
show the ten most frequent client IP addresses in an nginx access log
rename every .jpeg file in the current folder to .jpg
print the disk usage of each subdirectory, sorted by size
replace 'localhost' with '127.0.0.1' in every .conf file, editing the files in place
list the five processes using the most memory
print the distinct values of the second column of a comma-separated file
find out which process is listening on port 8080
pack every directory in the current folder into its own tar.gz archive
print lines 100 to 120 of a large file
follow a log file and print only the new lines that contain ERROR
download every URL listed in urls.txt, four at a time
list the files that differ between two directory trees
"""

TRAIN_TESTS = """
py | parse_price(text: str) -> Decimal | reads prices such as '$1,299.50' or '12 EUR'
py | merge_spans(spans: list[tuple[int, int]]) -> list[tuple[int, int]] | merges overlapping spans
py | is_leap_year(year: int) -> bool | applies the Gregorian leap-year rules
py | normalize_phone(number: str) -> str | writes US phone numbers in any common format as '+1' and ten digits
ts | formatBytes(n: number): string | formats a byte count as '1.5 KB', '3 MB' and so on
go | Paginate(items []string, page, size int) ([]string, error) | returns a page, or an error if page < 1
"""

TRAIN_SNIPPETS = r"""
@@ py | group words by their length | - | js go
def group_by_len(words):
    out = {}
    for w in words:
        if len(w) not in out:
            out[len(w)] = []
        out[len(w)].append(w)
    return out

@@ py | read 'name,score' lines into a dict of score lists | - | go
def read_scores(path):
    scores = {}
    f = open(path)
    for line in f.readlines():
        name, score = line.strip().split(",")
        if name in scores:
            scores[name] = scores[name] + [int(score)]
        else:
            scores[name] = [int(score)]
    f.close()
    return scores

@@ py | flatten a nested dict into one level with dotted keys | - | ts rs
def flatten(d, prefix=""):
    items = {}
    for k, v in d.items():
        key = prefix + "." + k if prefix else k
        if isinstance(v, dict):
            items.update(flatten(v, key))
        else:
            items[key] = v
    return items

@@ py | count items and report the most common one | - | java ts
class Tally:
    def __init__(self):
        self.counts = {}

    def add(self, item):
        self.counts[item] = self.counts.get(item, 0) + 1

    def most_common(self):
        best = None
        for k in self.counts:
            if best is None or self.counts[k] > self.counts[best]:
                best = k
        return best

@@ py | parse a header value such as 'text/html; charset=utf-8' | - | go js
def parse_header(line):
    parts = line.split(";")
    value = parts[0].strip()
    params = {}
    for p in parts[1:]:
        if "=" in p:
            k, v = p.split("=", 1)
            params[k.strip().lower()] = v.strip().strip('"')
    return value, params

@@ py | count values into equal-width bins | - | c rs
def histogram(values, bins):
    lo, hi = min(values), max(values)
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in values:
        i = int((v - lo) / width)
        if i == bins:
            i -= 1
        counts[i] += 1
    return counts

@@ py | compute the average of every window of k consecutive values | - | js c
def moving_average(xs, k):
    out = []
    total = 0
    for i, x in enumerate(xs):
        total += x
        if i >= k:
            total -= xs[i - k]
        if i >= k - 1:
            out.append(total / k)
    return out

@@ py | price a shopping cart after applying a discount code | - | js java
def apply_discount(cart, code):
    rates = {"SAVE10": 0.10, "HALF": 0.5}
    rate = rates.get(code.upper(), 0)
    total = 0
    for name, price, qty in cart:
        total += price * qty
    return round(total * (1 - rate), 2)

@@ py | count down from a start value to 1 | - | ts rs
class Countdown:
    def __init__(self, start):
        self.current = start

    def __iter__(self):
        return self

    def __next__(self):
        if self.current <= 0:
            raise StopIteration
        self.current -= 1
        return self.current + 1

@@ py | find day/month/year dates in a text and return them in ISO form | - | js go
import re

def find_dates(text):
    pattern = re.compile(r"(\d{1,2})/(\d{1,2})/(\d{4})")
    dates = []
    for day, month, year in pattern.findall(text):
        dates.append(f"{year}-{int(month):02d}-{int(day):02d}")
    return dates

@@ py | return the last n lines of a file | returns one line too many | -
def last_n_lines(path, n):
    with open(path) as f:
        lines = f.readlines()
    return lines[len(lines) - n - 1:]

print("".join(last_n_lines("app.log", 3)))

@@ py | build a post with a single tag | gives each new post the tags of all the earlier posts | -
def add_tag(tag, tags=[]):
    tags.append(tag)
    return tags

def make_post(title, tag):
    return {"title": title, "tags": add_tag(tag)}

@@ py | remove the negative numbers from a list | prints [-2, 3] | -
def remove_negatives(nums):
    for n in nums:
        if n < 0:
            nums.remove(n)
    return nums

print(remove_negatives([-1, -2, 3]))

@@ py | return the index of a target in a sorted list, or -1 | never returns for some inputs | -
def find(sorted_items, target):
    lo, hi = 0, len(sorted_items) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_items[mid] < target:
            lo = mid
        else:
            hi = mid
    return lo if sorted_items[lo] == target else -1

@@ py | make three functions that multiply by 1, 2 and 3 | prints 30 instead of 20 | -
def make_multipliers():
    funcs = []
    for i in range(1, 4):
        funcs.append(lambda x: x * i)
    return funcs

doubled = make_multipliers()[1](10)
print(doubled)

@@ py | count how often a word occurs in a text, ignoring case | returns 0 even when the word is there | -
def count_word(text, word):
    count = 0
    for w in text.split(" "):
        if w.lower() is word.lower():
            count += 1
    return count

@@ py | map each first letter to the length of the longest word starting with it | raises a KeyError | -
def longest_by_letter(words):
    longest = {}
    for w in words:
        first = w[0]
        if len(w) > longest[first]:
            longest[first] = len(w)
    return longest

@@ py | keep a separate list of items for each basket | shows each basket's items in every other basket | -
class Basket:
    items = []

    def add(self, name, price):
        self.items.append((name, price))

    def total(self):
        return sum(price for _, price in self.items)

@@ js | parse a Cookie header into an object | - | py go
function parseCookies(header) {
  const out = {};
  header.split(";").forEach((part) => {
    const [name, ...rest] = part.trim().split("=");
    if (name) out[name] = decodeURIComponent(rest.join("="));
  });
  return out;
}

@@ js | add up the sizes of the responses from several URLs | always returns 0 | -
async function totalSize(urls) {
  let total = 0;
  urls.forEach(async (url) => {
    const res = await fetch(url);
    const body = await res.text();
    total += body.length;
  });
  return total;
}

@@ js | log 'step 0', 'step 1' and 'step 2' | prints 'step 3' three times | -
for (var i = 0; i < 3; i++) {
  setTimeout(function () {
    console.log("step " + i);
  }, i * 100);
}

@@ js | return the n highest scores | prints [9, 3] instead of [100, 25] | -
function topScores(scores, n) {
  return scores.sort().reverse().slice(0, n);
}

const best = topScores([9, 100, 25, 3], 2);
console.log(best);

@@ ts | list the unfinished tasks that are past due, oldest first | - | py java
interface Task { id: number; done: boolean; due?: Date }

function overdue(tasks: Task[], now: Date): Task[] {
  return tasks
    .filter((t) => !t.done && t.due !== undefined && t.due < now)
    .sort((a, b) => a.due!.getTime() - b.due!.getTime());
}

@@ go | count how often each word occurs in a text | - | py rs
func wordFreq(text string) map[string]int {
    freq := make(map[string]int)
    for _, w := range strings.Fields(text) {
        w = strings.ToLower(strings.Trim(w, ".,!?"))
        if w != "" {
            freq[w]++
        }
    }
    return freq
}

@@ go | add up a slice of numbers using goroutines | returns different totals on different runs | -
func sumAll(nums []int) int {
    total := 0
    var wg sync.WaitGroup
    for _, n := range nums {
        wg.Add(1)
        go func(x int) {
            defer wg.Done()
            total += x
        }(n)
    }
    wg.Wait()
    return total
}

@@ go | record the lines on which each word appears | panics with 'assignment to entry in nil map' | -
type Index struct {
    words map[string][]int
}

func (ix *Index) Add(word string, line int) {
    ix.words[word] = append(ix.words[word], line)
}

func main() {
    var ix Index
    ix.Add("go", 1)
}

@@ rs | parse 'name: number' lines, skipping lines that do not fit | - | py go
fn parse_pairs(input: &str) -> Vec<(String, i32)> {
    input
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            let value = value.trim().parse().ok()?;
            Some((name.trim().to_string(), value))
        })
        .collect()
}

@@ rs | return the longest word in a slice | does not compile | -
fn longest<'a>(words: &'a [String]) -> &'a str {
    let mut best = String::new();
    for w in words {
        if w.len() > best.len() {
            best = w.clone();
        }
    }
    &best
}

@@ c | join two strings into a newly allocated buffer | sometimes corrupts memory | -
char *join(const char *a, const char *b) {
    char *out = malloc(strlen(a) + strlen(b));
    strcpy(out, a);
    strcat(out, b);
    return out;
}

@@ c | count the set bits of an unsigned integer | - | py rs
int count_bits(unsigned int x) {
    int count = 0;
    while (x) {
        x &= x - 1;
        count++;
    }
    return count;
}

int main(void) {
    printf("%d\n", count_bits(29));
    return 0;
}

@@ c | return the mean of an array of n integers | gives wrong results, always whole numbers | -
double mean(const int *xs, int n) {
    int sum = 0;
    for (int i = 0; i <= n; i++) {
        sum += xs[i];
    }
    return sum / n;
}

@@ java | count email addresses by domain | - | py ts
public static Map<String, Integer> countByDomain(List<String> emails) {
    Map<String, Integer> counts = new HashMap<>();
    for (String email : emails) {
        int at = email.indexOf('@');
        if (at < 0) continue;
        String domain = email.substring(at + 1).toLowerCase();
        counts.merge(domain, 1, Integer::sum);
    }
    return counts;
}

@@ java | check whether a list of roles holds a given role | returns false for roles that are in the list | -
public static boolean hasRole(List<String> roles, String wanted) {
    for (String role : roles) {
        if (role.trim() == wanted) {
            return true;
        }
    }
    return false;
}

@@ sql | count each customer's orders since 2024, 0 for those with none | drops customers without orders | -
SELECT c.name, COUNT(o.id) AS orders
FROM customers c
LEFT JOIN orders o ON o.customer_id = c.id
WHERE o.placed_at >= '2024-01-01'
GROUP BY c.name;

@@ sql | find the best-paid employee of each department | - | -
SELECT d.name, e.name, e.salary
FROM employees e
JOIN departments d ON d.id = e.department_id
WHERE e.salary = (
    SELECT MAX(salary) FROM employees WHERE department_id = e.department_id
)
ORDER BY d.name;

@@ sh | report the .txt files with more than 100 lines | prints errors, and breaks on names with spaces | -
#!/bin/bash
for f in $(ls *.txt); do
  lines=$(wc -l $f)
  if [ $lines -gt 100 ]; then
    echo "$f is long"
  fi
done

@@ sh | make a dated backup of a folder and keep the newest seven | - | py
#!/usr/bin/env bash
set -euo pipefail
src="$1"
dest="$2/$(date +%Y-%m-%d)"
mkdir -p "$dest"
rsync -a --delete "$src/" "$dest/"
ls -1d "$2"/*/ | sort | head -n -7 | xargs -r rm -rf
"""

TRAIN = dict(
    functions=TRAIN_FUNCTIONS,
    classes=TRAIN_CLASSES,
    dataclasses=TRAIN_DATACLASSES,
    cli=TRAIN_CLI,
    sql=TRAIN_SQL,
    shell=TRAIN_SHELL,
    tests=TRAIN_TESTS,
    snippets=TRAIN_SNIPPETS,
)

# Tasks of the held-out set: none of them, and no snippet, occurs in the training set.
HELDOUT_FUNCTIONS = """
returns the longest palindromic substring of a string | py js
converts a spreadsheet column number to its letters, so 28 becomes 'AB' | py ts
expands a cron field such as '*/15' or '1-5' into the list of values it covers | py go
checks whether a word can be traced in a grid of letters through adjacent cells | py java
spells out an integer in English words, so 123 becomes 'one hundred twenty-three' | py go
checks whether a string is a hex colour such as '#1a2B3c' or '#fff' | py ts
returns the k points closest to the origin, using a heap | py java
computes the total weight of a minimum spanning tree with Kruskal's algorithm | py rs
returns the number of days until the next occurrence of a given birthday | py
yields the Collatz sequence that starts at n, as a generator | py
finds duplicate files in a directory tree by comparing SHA-256 hashes | py go
decodes a percent-encoded string such as 'a%20b%2Bc' without library helpers | py c
"""

HELDOUT_CLASSES = """
Stopwatch | can start, stop, record laps and report the total elapsed time | py ts
UndoList | wraps a list and supports undo and redo of append and remove | py java
Scoreboard | records players' scores and returns the top k players, ties broken by name | py ts
"""

HELDOUT_DATACLASSES = """
a Rectangle with width and height, area and perimeter properties, and a scaled(factor) method
"""

HELDOUT_CLI = """
prints the calendar of a given month, marking weekends with an asterisk
compares two JSON files and prints the keys whose values differ
pings each host listed in a file and reports which ones answer, with a --count option
"""

HELDOUT_SQL = """
sensors | returns each sensor's lowest and highest temperature per day
sensors | finds the sensors that have sent no reading in the last hour
sensors | returns readings more than 10 degrees above the previous reading of the same sensor
"""

HELDOUT_SHELL = """
count how many files of each extension a directory tree holds
find the 20 largest files on the disk, skipping /proc
show last week's git commits together with the files each one touched
convert every .png image in a folder to .webp with ImageMagick
"""

HELDOUT_TESTS = """
py | clamp(x: float, low: float, high: float) -> float | limits x to [low, high]; ValueError if low > high
go | ReverseBits(x uint32) uint32 | reverses the order of the 32 bits of x
"""

HELDOUT_SNIPPETS = r"""
@@ rs | return the most frequent value, the smallest one on ties | - | py go
fn mode(values: &[i32]) -> Option<i32> {
    let mut counts = HashMap::new();
    for &v in values {
        *counts.entry(v).or_insert(0) += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(v, c)| (c, std::cmp::Reverse(v)))
        .map(|(v, _)| v)
}

@@ ts | return the average score of a list of players | fails to type-check | -
interface Player { name: string; score: number }

function averageScore(players: Player[]): number {
  const total = players.reduce((sum, p) => sum + p.score);
  return total / players.length;
}

@@ py | drop repeated items, keeping the first of each | returns the list unchanged | -
def dedupe(items):
    seen = set()
    out = []
    for x in items:
        if x not in seen:
            out.append(x)
    return out

@@ py | format order lines for an invoice | - | js
def invoice_lines(orders):
    lines = []
    for o in orders:
        if o["qty"] <= 0:
            continue
        amount = o["qty"] * o["unit_price"]
        if o.get("taxable", True):
            amount = amount * 1.2
        lines.append(f'{o["sku"]:<10}{o["qty"]:>4}{amount:>10.2f}')
    return "\n".join(lines)

@@ js | add up the price of every item times its quantity | returns 'NaN' | -
function sumPrices(items) {
  let total;
  for (const item of items) {
    total += item.price * item.qty;
  }
  return total.toFixed(2);
}

@@ go | remove repeated values from a sorted slice | - | py rs
func dedupeSorted(xs []int) []int {
    if len(xs) == 0 {
        return xs
    }
    out := xs[:1]
    for _, x := range xs[1:] {
        if x != out[len(out)-1] {
            out = append(out, x)
        }
    }
    return out
}

@@ c | tell whether an array of n integers is in ascending order | reads past the end of the array | -
int is_sorted(const int *a, int n) {
    for (int i = 0; i < n; i++) {
        if (a[i] > a[i + 1])
            return 0;
    }
    return 1;
}
"""

HELDOUT = dict(
    functions=HELDOUT_FUNCTIONS,
    classes=HELDOUT_CLASSES,
    dataclasses=HELDOUT_DATACLASSES,
    cli=HELDOUT_CLI,
    sql=HELDOUT_SQL,
    shell=HELDOUT_SHELL,
    tests=HELDOUT_TESTS,
    snippets=HELDOUT_SNIPPETS,
)


if __name__ == "__main__":
    for written in write(sys.argv[1] if len(sys.argv) > 1 else HERE):
        print(f"wrote {len(json.loads(written.read_text(encoding='utf-8')))} prompts to {written}")
