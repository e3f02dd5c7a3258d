"""Honest helper/main solutions in which main needs the helper's work (issue 41's guard).

Each pair is ``(task, work, aux, main)``: a HumanEval row index, what the helper does, and the two
agents' completions. The helper does a real, problem-specific piece of the work (a predicate, a
parser, a per-item transform, a key function, an aggregate) and main calls it on its real
arguments and needs its result to pass the tests. Used by ``tests/test_honest_pairs.py``: each
pair passes every test and earns the bonus the reward pays for genuine cooperation.
"""

from __future__ import annotations

from typing import NamedTuple


class HonestPair(NamedTuple):
    task: int
    work: str
    aux: str
    main: str


PAIRS = [
    HonestPair(
        1,
        "per-character depth change (a parser's step)",
        "def aux(c):\n    return 1 if c == '(' else -1 if c == ')' else 0\n",
        "def separate_paren_groups(paren_string):\n    groups, cur, depth = [], [], 0\n"
        "    for c in paren_string:\n        d = aux(c)\n        if d == 0:\n            continue\n"
        "        depth += d\n        cur.append(c)\n        if depth == 0:\n"
        "            groups.append(''.join(cur))\n            cur = []\n    return groups\n",
    ),
    HonestPair(
        7,
        "a predicate (substring test)",
        "def aux(s, sub):\n    return sub in s\n",
        "def filter_by_substring(strings, substring):\n    return [s for s in strings if aux(s, substring)]\n",
    ),
    HonestPair(
        11,
        "the xor of two bits as text",
        "def aux(x, y):\n    return '0' if x == y else '1'\n",
        "def string_xor(a, b):\n    return ''.join(aux(x, y) for x, y in zip(a, b))\n",
    ),
    HonestPair(
        13,
        "a divisibility predicate",
        "def aux(n, d):\n    return n % d == 0\n",
        "def greatest_common_divisor(a, b):\n    for d in range(min(a, b), 0, -1):\n"
        "        if aux(a, d) and aux(b, d):\n            return d\n    return 1\n",
    ),
    HonestPair(
        17,
        "a tokenizer (the notes of the string)",
        "def aux(s):\n    return [x for x in s.split(' ') if x]\n",
        "def parse_music(music_string):\n    beats = {'o': 4, 'o|': 2, '.|': 1}\n"
        "    return [beats[t] for t in aux(music_string)]\n",
    ),
    HonestPair(
        19,
        "a key function (a number word's value)",
        "def aux(word):\n    return ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight',"
        " 'nine'].index(word)\n",
        "def sort_numbers(numbers):\n    return ' '.join(sorted([w for w in numbers.split(' ') if w], key=aux))\n",
    ),
    HonestPair(
        20,
        "a distance between two numbers",
        "def aux(a, b):\n    return abs(a - b)\n",
        "def find_closest_elements(numbers):\n    best = None\n    for i, a in enumerate(numbers):\n"
        "        for j, b in enumerate(numbers):\n            if i != j:\n                d = aux(a, b)\n"
        "                if best is None or d < best[0]:\n                    best = (d, min(a, b), max(a, b))\n"
        "    return (best[1], best[2])\n",
    ),
    HonestPair(
        21,
        "the range (min, max) of a list",
        "def aux(numbers):\n    return (min(numbers), max(numbers))\n",
        "def rescale_to_unit(numbers):\n    lo, hi = aux(numbers)\n"
        "    return [(x - lo) / (hi - lo) for x in numbers]\n",
    ),
    HonestPair(
        25,
        "the smallest prime factor",
        "def aux(n):\n    i = 2\n    while i * i <= n:\n        if n % i == 0:\n            return i\n"
        "        i += 1\n    return n\n",
        "def factorize(n):\n    fact = []\n    while n > 1:\n        p = aux(n)\n        fact.append(p)\n"
        "        n //= p\n    return fact\n",
    ),
    HonestPair(
        26,
        "a count of one value in a list",
        "def aux(numbers, n):\n    return numbers.count(n)\n",
        "def remove_duplicates(numbers):\n    return [n for n in numbers if aux(numbers, n) == 1]\n",
    ),
    HonestPair(
        27,
        "a per-character transform (swap case)",
        "def aux(ch):\n    return ch.lower() if ch.isupper() else ch.upper()\n",
        "def flip_case(string):\n    return ''.join(aux(c) for c in string)\n",
    ),
    HonestPair(
        33,
        "sorting a sub-list",
        "def aux(values):\n    return sorted(values)\n",
        "def sort_third(l):\n    l = list(l)\n    l[::3] = aux(l[::3])\n    return l\n",
    ),
    HonestPair(
        46,
        "one step of the recurrence (sum of a window)",
        "def aux(window):\n    return sum(window)\n",
        "def fib4(n):\n    w = [0, 0, 2, 0]\n    if n < 4:\n        return w[n]\n"
        "    for _ in range(4, n + 1):\n        w = w[1:] + [aux(w)]\n    return w[-1]\n",
    ),
    HonestPair(
        47,
        "sorting",
        "def aux(l):\n    return sorted(l)\n",
        "def median(l):\n    s = aux(l)\n    m = len(s) // 2\n"
        "    return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2.0\n",
    ),
    HonestPair(
        55,
        "one step of the Fibonacci pair",
        "def aux(a, b):\n    return (b, a + b)\n",
        "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = aux(a, b)\n    return a\n",
    ),
    HonestPair(
        59,
        "the smallest prime factor",
        "def aux(n):\n    d = 2\n    while d * d <= n:\n        if n % d == 0:\n            return d\n"
        "        d += 1\n    return n\n",
        "def largest_prime_factor(n):\n    largest = 1\n    while n > 1:\n        p = aux(n)\n"
        "        largest = max(largest, p)\n        n //= p\n    return largest\n",
    ),
    HonestPair(
        64,
        "a vowel predicate",
        "def aux(ch):\n    return ch in 'aeiouAEIOU'\n",
        "def vowels_count(s):\n    n = sum(1 for c in s if aux(c))\n"
        "    return n + 1 if s and s[-1] in 'yY' else n\n",
    ),
    HonestPair(
        66,
        "a per-character value (upper case code)",
        "def aux(ch):\n    return ord(ch) if ch.isupper() else 0\n",
        "def digitSum(s):\n    return sum(aux(c) for c in s)\n",
    ),
    HonestPair(
        67,
        "a parser (the numbers in a sentence)",
        "def aux(s):\n    return [int(t) for t in s.split(' ') if t.isdigit()]\n",
        "def fruit_distribution(s, n):\n    return n - sum(aux(s))\n",
    ),
    HonestPair(
        71,
        "a validity predicate (the triangle inequality)",
        "def aux(a, b, c):\n    return a + b > c and a + c > b and b + c > a\n",
        "def triangle_area(a, b, c):\n    if not aux(a, b, c):\n        return -1\n    s = (a + b + c) / 2\n"
        "    return round((s * (s - a) * (s - b) * (s - c)) ** 0.5, 2)\n",
    ),
    HonestPair(
        73,
        "a mismatch predicate",
        "def aux(x, y):\n    return x != y\n",
        "def smallest_change(arr):\n    n = len(arr)\n"
        "    return sum(1 for i in range(n // 2) if aux(arr[i], arr[n - 1 - i]))\n",
    ),
    HonestPair(
        78,
        "a prime-hex-digit predicate",
        "def aux(ch):\n    return ch in '2357BD'\n",
        "def hex_key(num):\n    return sum(1 for ch in num if aux(ch))\n",
    ),
    HonestPair(
        79,
        "binary digits of a number",
        "def aux(n):\n    return bin(n)[2:]\n",
        "def decimal_to_binary(decimal):\n    return 'db' + aux(decimal) + 'db'\n",
    ),
    HonestPair(
        85,
        "selection (the items at odd indices)",
        "def aux(lst):\n    return [lst[i] for i in range(1, len(lst), 2)]\n",
        "def add(lst):\n    return sum(x for x in aux(lst) if x % 2 == 0)\n",
    ),
    HonestPair(
        86,
        "a per-word transform (letters sorted)",
        "def aux(word):\n    return ''.join(sorted(word))\n",
        "def anti_shuffle(s):\n    return ' '.join(aux(w) for w in s.split(' '))\n",
    ),
    HonestPair(
        91,
        "a sentence predicate (starts with 'I ')",
        "def aux(sentence):\n    return sentence[0:2] == 'I '\n",
        "import re\ndef is_bored(S):\n    return sum(1 for s in re.split(r'[.?!]\\s*', S) if aux(s))\n",
    ),
    HonestPair(
        96,
        "a primality predicate",
        "def aux(k):\n    return k > 1 and all(k % d for d in range(2, int(k ** 0.5) + 1))\n",
        "def count_up_to(n):\n    return [k for k in range(2, n) if aux(k)]\n",
    ),
    HonestPair(
        104,
        "a digit predicate (all digits odd)",
        "def aux(n):\n    return all(int(c) % 2 == 1 for c in str(n))\n",
        "def unique_digits(x):\n    return sorted(i for i in x if aux(i))\n",
    ),
    HonestPair(
        108,
        "a signed digit sum",
        "def aux(n):\n    s = [int(c) for c in str(abs(n))]\n    if n < 0:\n        s[0] = -s[0]\n"
        "    return sum(s)\n",
        "def count_nums(arr):\n    return sum(1 for n in arr if aux(n) > 0)\n",
    ),
    HonestPair(
        116,
        "a key function (count of one bits)",
        "def aux(n):\n    return bin(n).count('1')\n",
        "def sort_array(arr):\n    return sorted(sorted(arr), key=aux)\n",
    ),
]
"""Thirty pairs on thirty problems; every output type but bool (on a bool output the reward pays
the helper's half only: an aggregating main cannot be told from a wrapper by values)."""
