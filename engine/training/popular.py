"""The standard-library names people ask about most, written as people write them.

These entries get many more chat passes than the rest of the corpus, and they are always
on the training side of the split: the bundled model is meant to recall them. The names
are resolved against the running interpreter (`corpus.popular_entries`), so the answers
are that version's own docstrings; a name without a docstring there is skipped.

Two sources make the list, each by a stated rule rather than by any question set:
- the whole public surface of the EVERYDAY_MODULES, the modules a tutorial or a beginner's
  file-and-data code imports: every function and class their `__all__` names (or, for a
  module without one, every public name) that the module defines itself, exceptions excepted;
- the curated groups of POPULAR_NAMES (builtins, `str` / `list` / `dict` methods, the main
  names of the other common modules), of which a build keeps the leading share of each group.
"""

from __future__ import annotations

import importlib
import inspect
from functools import cache

# Dotted names as a person types them; the first word is what gets imported to read the docstring.
POPULAR_NAMES: dict[str, str] = {
    "builtins": """
        print len range open str int list dict set tuple enumerate zip map filter sorted isinstance
        input type sum min max abs round any all bool float iter next reversed getattr setattr
        hasattr super property staticmethod classmethod repr format id hash callable chr ord hex
        bin oct divmod pow eval exec vars dir frozenset slice object issubclass""",
    "str": """
        str.split str.join str.strip str.replace str.format str.startswith str.endswith str.lower
        str.upper str.find str.count str.encode str.splitlines str.zfill str.title str.capitalize
        str.isdigit str.isalpha str.lstrip str.rstrip str.partition str.center str.index
        str.isspace str.casefold str.removeprefix""",
    "list": "list.append list.extend list.pop list.sort list.insert list.remove list.index list.copy list.clear",
    "dict": "dict.get dict.setdefault dict.fromkeys dict.copy dict.clear set.add set.union set.intersection",
    "json": "json.dumps json.loads json json.dump json.load json.JSONEncoder json.JSONDecoder json.JSONDecodeError",
    "os": """
        os os.getcwd os.listdir os.makedirs os.mkdir os.remove os.rename os.walk os.getenv os.chdir
        os.scandir os.rmdir os.system os.cpu_count os.getpid os.urandom os.replace os.stat""",
    "os.path": """
        os.path os.path.join os.path.exists os.path.isfile os.path.isdir os.path.basename
        os.path.dirname os.path.abspath os.path.splitext os.path.split os.path.getsize
        os.path.expanduser os.path.realpath os.path.relpath os.path.normpath os.path.isabs
        os.path.getmtime""",
    "pathlib": """
        pathlib pathlib.Path pathlib.PurePath pathlib.Path.read_text pathlib.Path.write_text
        pathlib.Path.exists pathlib.Path.mkdir pathlib.Path.glob pathlib.Path.iterdir
        pathlib.Path.open pathlib.Path.resolve pathlib.Path.unlink pathlib.Path.is_file
        pathlib.Path.is_dir pathlib.Path.rglob pathlib.Path.cwd pathlib.Path.home
        pathlib.Path.read_bytes pathlib.Path.touch pathlib.PurePath.with_suffix
        pathlib.PurePath.joinpath pathlib.PurePath.relative_to""",
    "re": """
        re.search re.sub re.compile re re.match re.fullmatch re.subn re.findall re.finditer re.split
        re.escape re.Pattern re.Match""",
    "collections": """
        collections collections.Counter collections.defaultdict collections.OrderedDict
        collections.namedtuple collections.deque collections.ChainMap collections.UserDict
        collections.Counter.most_common collections.Counter.elements collections.Counter.update
        collections.Counter.subtract collections.deque.appendleft collections.deque.popleft
        collections.deque.rotate collections.OrderedDict.move_to_end""",
    "itertools": """
        itertools itertools.chain itertools.product itertools.permutations itertools.combinations
        itertools.combinations_with_replacement itertools.groupby itertools.islice itertools.count
        itertools.cycle itertools.repeat itertools.accumulate itertools.zip_longest itertools.starmap
        itertools.takewhile itertools.dropwhile itertools.tee itertools.compress
        itertools.filterfalse itertools.pairwise""",
    "functools": """
        functools.lru_cache functools.partial functools functools.reduce functools.wraps
        functools.cache functools.cached_property functools.total_ordering functools.singledispatch
        functools.cmp_to_key functools.update_wrapper""",
    "datetime": """
        datetime datetime.datetime datetime.date datetime.time datetime.timedelta datetime.timezone
        datetime.datetime.now datetime.datetime.strftime datetime.datetime.strptime
        datetime.datetime.fromisoformat datetime.datetime.isoformat datetime.date.today
        datetime.datetime.timestamp datetime.datetime.fromtimestamp datetime.datetime.combine
        datetime.date.weekday datetime.datetime.replace""",
    "math": """
        math math.sqrt math.floor math.ceil math.log math.log2 math.log10 math.exp math.sin math.cos
        math.tan math.factorial math.gcd math.isclose math.pow math.fabs math.hypot math.comb
        math.perm math.isqrt math.prod math.fsum math.trunc math.radians math.degrees math.isnan
        math.isinf math.atan2 math.lcm math.dist""",
    "random": """
        random.choice random.randint random random.random random.choices random.shuffle
        random.sample random.uniform random.seed random.randrange random.gauss random.Random""",
    "sys": "sys sys.exit sys.getsizeof sys.getrecursionlimit sys.setrecursionlimit sys.exc_info sys.intern",
    "subprocess": """
        subprocess subprocess.run subprocess.Popen subprocess.check_output subprocess.call
        subprocess.check_call subprocess.CompletedProcess subprocess.CalledProcessError
        subprocess.TimeoutExpired subprocess.Popen.communicate subprocess.Popen.wait
        subprocess.Popen.poll subprocess.getoutput""",
    "typing": """
        typing typing.Optional typing.Union typing.List typing.Dict typing.Any typing.Callable
        typing.TypeVar typing.Generic typing.Protocol typing.NamedTuple typing.TypedDict typing.cast
        typing.overload typing.Literal typing.Final typing.get_type_hints typing.Tuple
        typing.Iterable typing.Sequence""",
    "dataclasses": """
        dataclasses dataclasses.dataclass dataclasses.field dataclasses.asdict dataclasses.astuple
        dataclasses.replace dataclasses.fields dataclasses.is_dataclass dataclasses.make_dataclass""",
    "shutil": """
        shutil shutil.copy shutil.copyfile shutil.copy2 shutil.copytree shutil.rmtree shutil.move
        shutil.which shutil.disk_usage shutil.make_archive""",
    "time": """
        time time.time time.sleep time.perf_counter time.monotonic time.strftime time.strptime
        time.localtime time.gmtime time.ctime time.time_ns time.process_time""",
    "logging": """
        logging logging.getLogger logging.basicConfig logging.Logger logging.Handler
        logging.StreamHandler logging.FileHandler logging.Formatter logging.debug logging.info
        logging.warning logging.error logging.exception logging.Logger.setLevel
        logging.Logger.addHandler""",
    "argparse": """
        argparse argparse.ArgumentParser argparse.ArgumentParser.add_argument
        argparse.ArgumentParser.parse_args argparse.Namespace argparse.FileType""",
    "csv": "csv csv.reader csv.writer csv.DictReader csv.DictWriter csv.Sniffer",
    "string": "string string.Template string.Formatter string.capwords",
    "textwrap": "textwrap textwrap.wrap textwrap.fill textwrap.dedent textwrap.indent textwrap.shorten",
    "copy": "copy copy.copy copy.deepcopy",
    "pickle": "pickle pickle.dumps pickle.loads pickle.dump pickle.load",
    "glob": "glob glob.glob glob.iglob",
    "tempfile": """
        tempfile tempfile.TemporaryDirectory tempfile.NamedTemporaryFile tempfile.TemporaryFile
        tempfile.mkdtemp tempfile.mkstemp tempfile.gettempdir""",
    "threading": """
        threading threading.Thread threading.Lock threading.RLock threading.Event
        threading.Condition threading.Semaphore threading.Timer threading.Thread.start
        threading.Thread.join threading.current_thread threading.local""",
    "asyncio": """
        asyncio asyncio.run asyncio.gather asyncio.sleep asyncio.create_task asyncio.wait_for
        asyncio.Queue asyncio.Event asyncio.Lock asyncio.get_event_loop asyncio.Task asyncio.Future
        asyncio.as_completed asyncio.Semaphore asyncio.TaskGroup""",
    "heapq": "heapq heapq.heappush heapq.heappop heapq.heapify heapq.nlargest heapq.nsmallest heapq.merge",
    "bisect": "bisect bisect.bisect_left bisect.bisect_right bisect.insort_left bisect.insort_right",
    "statistics": """
        statistics statistics.mean statistics.median statistics.mode statistics.stdev
        statistics.variance statistics.quantiles statistics.fmean""",
    "enum": "enum enum.Enum enum.IntEnum enum.Flag enum.auto enum.unique enum.StrEnum",
    "contextlib": """
        contextlib contextlib.contextmanager contextlib.suppress contextlib.closing
        contextlib.ExitStack contextlib.redirect_stdout contextlib.nullcontext""",
    "abc": "abc abc.ABC abc.abstractmethod abc.ABCMeta",
    "operator": "operator operator.itemgetter operator.attrgetter operator.methodcaller",
    "hashlib": "hashlib hashlib.sha256 hashlib.md5 hashlib.new hashlib.pbkdf2_hmac",
    "base64": "base64 base64.b64encode base64.b64decode base64.urlsafe_b64encode",
    "uuid": "uuid uuid.uuid4 uuid.uuid1 uuid.UUID",
    "urllib": """
        urllib.parse urllib.parse.urlparse urllib.parse.urlencode urllib.parse.quote
        urllib.parse.unquote urllib.parse.urljoin urllib.parse.parse_qs urllib.request.urlopen""",
    "io": "io io.StringIO io.BytesIO io.TextIOWrapper",
    "zipfile": "zipfile zipfile.ZipFile zipfile.ZipFile.extractall zipfile.is_zipfile",
    "unittest": """
        unittest unittest.TestCase unittest.main unittest.TestCase.assertEqual
        unittest.TestCase.setUp unittest.mock.Mock unittest.mock.patch unittest.mock.MagicMock""",
    "numbers": "fractions.Fraction decimal.Decimal",
    "pprint": "pprint pprint.pprint pprint.pformat",
    "timeit": "timeit timeit.timeit timeit.Timer",
    "traceback": "traceback traceback.print_exc traceback.format_exc",
    "warnings": "warnings warnings.warn warnings.filterwarnings warnings.catch_warnings",
    "inspect": "inspect inspect.signature inspect.getsource inspect.getmembers inspect.isfunction",
    "more": """
        types.SimpleNamespace queue.Queue queue.PriorityQueue concurrent.futures.ThreadPoolExecutor
        concurrent.futures.ProcessPoolExecutor concurrent.futures.as_completed multiprocessing.Pool
        multiprocessing.Process secrets secrets.token_hex secrets.token_urlsafe struct.pack
        struct.unpack socket.socket sqlite3.connect gzip.open tarfile.open configparser.ConfigParser
        platform.system shlex.split shlex.quote fnmatch.fnmatch difflib.SequenceMatcher
        difflib.get_close_matches difflib.unified_diff calendar.monthrange calendar.isleap
        getpass.getpass weakref.ref array.array html.escape html.unescape
        xml.etree.ElementTree.parse xml.etree.ElementTree.fromstring""",
}

# Sections of the language reference (pydoc topics), by their titles in the corpus.
POPULAR_TOPICS = [
    "the `with` statement", "the `for` statement", "the `while` statement", "the `if` statement",
    "the `try` statement", "the `import` statement", "the `return` statement", "the `yield` statement",
    "the `assert` statement", "the `del` statement", "the `pass` statement", "the `break` statement",
    "the `continue` statement", "the `raise` statement", "the `global` statement",
    "the `nonlocal` statement", "the `match` statement", "function definitions", "class definitions",
    "lambdas", "list displays", "dictionary displays", "comparisons", "boolean operations",
    "slicings", "calls", "truth value testing", "string methods", "format string syntax",
    "assignment statements", "augmented assignment statements", "exceptions", "keywords",
    "operator precedence", "string and bytes literals", "lists", "tuples", "ranges",
    "mapping types — `dict`", "set types", "generator functions", "coroutine function definition",
    "await expression", "membership test operations", "identity comparisons", "integer literals",
    "the power operator", "binary arithmetic operations", "special method names",
    "with statement context managers",
]


# Modules whose whole public surface is popular: file and path helpers, JSON, regular expressions,
# iteration and containers, copying, time, temporary files, text wrapping, shell-style file operations.
EVERYDAY_MODULES = ["os.path", "pathlib", "json", "re", "itertools", "collections", "heapq", "bisect", "copy",
                    "time", "tempfile", "textwrap", "shutil", "glob", "fnmatch", "functools"]
# Where a module's public names are implemented when not in the module itself (C accelerators and the like).
IMPLEMENTED_IN = {"os.path": ("posixpath", "genericpath"), "time": ("strptime",)}

# How many popular entries the default build keeps (the everyday surface plus a share of the curated groups).
DEFAULT_POPULAR_ENTRIES = 400


@cache
def everyday_names() -> tuple[str, ...]:
    """The public functions and classes of EVERYDAY_MODULES that each module defines (names as `json.loads`).

    A name the module only re-exports from elsewhere (`shutil.os`) and exception classes are left out;
    a C accelerator's name counts as its module's (`heapq.heappush` lives in `_heapq`).
    """
    names = []
    for module_name in EVERYDAY_MODULES:
        module = importlib.import_module(module_name)
        homes = {module_name.split(".")[0], *IMPLEMENTED_IN.get(module_name, ())}
        public = getattr(module, "__all__", None) or [name for name in dir(module) if not name.startswith("_")]
        for name in public:
            obj = getattr(module, name, None)
            if obj is None or inspect.ismodule(obj) or not callable(obj):
                continue
            if isinstance(obj, type) and issubclass(obj, BaseException):
                continue
            home = (getattr(obj, "__module__", None) or module_name).lstrip("_").split(".")[0]
            if home in homes:
                names.append(f"{module_name}.{name}")
    return tuple(names)


def leading_share(names: list[str], share: float) -> list[str]:
    """The first `share` of a curated group (at least one name): the group's most asked-about part."""
    return names[:max(1, round(share * len(names)))]


def popular_names(share: float = 1.0) -> list[str]:
    """Popular dotted names: the curated groups in the order above, then the everyday surface (duplicates
    dropped); `share` < 1 keeps the leading share of every curated group, so a smaller build still covers
    every module's main names."""
    names = [name for group in POPULAR_NAMES.values() for name in leading_share(group.split(), share)]
    return list(dict.fromkeys(names + EVERYDAY_MODULES + list(everyday_names())))


def popular_topics(share: float = 1.0) -> list[str]:
    """The leading `share` of POPULAR_TOPICS (statements come first)."""
    return leading_share(POPULAR_TOPICS, share)


def popular_share(entries: int | None) -> float:
    """The share of every curated group that keeps about `entries` popular names and topics in all (the
    everyday surface always stays)."""
    if entries is None:
        return 1.0
    for percent in range(1, 101):
        if len(popular_names(percent / 100)) + len(popular_topics(percent / 100)) >= entries:
            return percent / 100
    return 1.0


# Questions the playground offers as examples, with the popular entry each asks about; the
# build grades the bundled model's answer to each (see the card's "Suggested questions").
SUGGESTED_QUESTIONS = [
    ("What does json.dumps do?", "json.dumps"),
    ("What does json.loads do?", "json.loads"),
    ("What does the json module do?", "json"),
    ("What is glob.glob for?", "glob.glob"),
    ("How do I use pathlib.Path?", "pathlib.Path"),
    ("Explain the with statement.", "the `with` statement"),
    ("What is collections.Counter?", "collections.Counter"),
    ("what does os.path.join do", "os.path.join"),
    ("Explain itertools.chain.", "itertools.chain"),
    ("What does str.split do?", "str.split"),
    ("What is functools.lru_cache for?", "functools.lru_cache"),
    ("What does len do?", "len"),
    ("explain the for statement", "the `for` statement"),
    ("How do I use subprocess.run?", "subprocess.run"),
    ("What does re.sub do?", "re.sub"),
    ("What is dataclasses.dataclass?", "dataclasses.dataclass"),
    ("What does random.choice do?", "random.choice"),
]
