"""The ``data`` section's schemas, one per source (``data=adult | table | synthetic | atlas``);
their checks: :mod:`dptrain.settings.data`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dptrain.core.validation import setting

TEST_PUBLIC_HELP = ("true only when the test rows are PUBLIC data (a published benchmark split, generated data): "
                    "then test metrics are publishable (metrics.json); otherwise they stay in private/")


@dataclass
class NumericColumn:
    """A numeric feature with PUBLIC bounds: values are clipped into [lower, upper], then
    scaled to [0, 1] by those bounds. ``transform: log1p`` applies log(1 + x) after clipping
    (both bounds transformed too), useful for heavy-tailed money columns. Both bounds are
    required: there is no default range."""

    lower: float | None = setting(None, help="PUBLIC lower bound (documentation, domain knowledge; never the rows): "
                                  "smaller values are clipped up to it", allowed="a finite number < upper (required)")
    upper: float | None = setting(None, help="PUBLIC upper bound: larger values are clipped down to it",
                                  allowed="a finite number > lower (required)")
    transform: str = setting("none", help="log1p: log(1 + x) after clipping (bounds too), for heavy tails",
                             allowed="none | log1p (log1p needs lower > -1)")


@dataclass
class TargetBounds:
    """The PUBLIC bounds of a continuous target (``data.target_bounds``): values are clipped into
    [lower, upper] (how many: private/data_diagnostics.json) and scaled to [0, 1] by them for
    training; metrics and predictions are reported back in the original units. Both null (the
    default) declares no continuous target."""

    lower: float | None = setting(None, help="PUBLIC lower bound of the target (documentation, domain knowledge; "
                                  "never the rows)", allowed="a finite number < upper (required with upper)")
    upper: float | None = setting(None, help="PUBLIC upper bound of the target",
                                  allowed="a finite number > lower (required with lower)")


CLASSES_HELP = ("a multiclass target's PUBLIC class list (objective=multinomial): label i is the i-th class; a row "
                "whose label is not declared (or is missing) is left out and counted (private/data_diagnostics.json)")


CLASSES_ALLOWED = "a list of at least 2 distinct labels (strings or numbers) | null"


NEGATIVE_HELP = ("the label of the negative class (label 0), required with data.positive: both labels of a binary "
                 "target are declared, so a variant ('Yes' beside 'yes') or a missing target is never read as a "
                 "negative; it is left out and counted, or merged by data.label_map")


LABEL_MAP_HELP = ("labels as the file writes them mapped to the declared ones, per column (the target or a "
                  "categorical column), e.g. {answer: {'Yes': yes}, region: {Sud: Süd}}; applied before the labels are "
                  "compared; how many rows each map changed: private/data_diagnostics.json")


LABEL_MAP_ALLOWED = ("column: {file label: declared label}; the column the target or a data.categorical column, each "
                     "declared label one of that column's")


UNLISTED_HELP = ("a categorical column's value that is not in its declared list (a missing one included): other: it "
                 "goes to the column's <other> slot (counted as lumped); drop: the row is left out (counted); the "
                 "counts: private/data_diagnostics.json and one console line")


NONFINITE_HELP = ("a numeric column's (or a continuous target's) missing, NaN, infinite or non-numeric entry: drop: "
                  "the row is left out and counted (private/data_diagnostics.json, one console line); error: refuse "
                  "the table, naming the column and the kind of entry (a refusal that depends on the rows: a table "
                  "with one such row is refused, its neighbour without it runs; find such rows with dptrain check)")


THOUSANDS_HELP = ("the digit-group separator of numbers written as text, e.g. ',' for 60,366: numeric columns are "
                  "then read as text and parsed with it (and data.decimal); null: no separator")


DECIMAL_HELP = "the decimal mark of numbers written as text: '.' (3.5) or ',' (3,5)"


BOUNDS_HELP = ("a continuous target's PUBLIC bounds (objective=linear), e.g. {lower: 1, upper: 99}: the target is "
               "clipped into them and scaled to [0, 1] for training; metrics and predictions in original units")


BOUNDS_ALLOWED = "{lower: L, upper: U} with finite L < U; both null (the default): no continuous target"


PRIVACY_UNIT_HELP = ("the column whose value is the unit of privacy (a person, a household, an establishment id): the "
                     "guarantee then covers ALL rows of one unit, each unit counting at most "
                     "privacy.max_rows_per_unit rows (a secret random choice); the split is by unit; the column is "
                     "never a feature. null: one row is the unit (a person with k rows is protected only at the "
                     "group-privacy level for k; docs/privacy.md, Units of privacy)")


PRIVACY_UNIT_ALLOWED = ("a column of the file that is not the target, a feature or data.split_column (a row without "
                        "a unit id is left out, counted) | null")


@dataclass
class AdultDataConfig:
    """data=adult: the shipped UCI Adult file (SHA-256 checked) with its public UCI schema."""

    name: str = setting("adult", help="the data source; pick it with data=adult (a config group)", allowed="adult")
    schema: str = setting("adult", help="the shipped public schema: target income (label 1: >50K), the original "
                          "UCI split, 5 numeric columns with documented bounds and 8 categorical columns (112 "
                          "features); the file dptrain/data/adult/schema.yaml", allowed="adult")
    test_public: bool = setting(True, help=TEST_PUBLIC_HELP + " (the UCI test file is public)",
                                allowed="true | false")
    target: str | None = setting(None, help="another column of the Adult file as the target (null: the schema's "
                                 "income); it is removed from the features. Declare its kind with data.classes, "
                                 "data.target_bounds or data.positive", allowed="a column of the Adult file | null")
    positive: str | None = setting(None, help="a binary target's positive label (with data.target; null: the "
                                   "schema's >50K for income)", allowed="a label of the target column | null")
    negative: str | None = setting(None, help="a binary target's negative label (required with data.positive; "
                                   "null: the schema's <=50K for income)", allowed="a label of the target column | "
                                   "null")
    classes: list[Any] | None = setting(None, help=CLASSES_HELP + ", e.g. relationship's six documented categories",
                                        allowed=CLASSES_ALLOWED)
    target_bounds: TargetBounds | None = setting(help=BOUNDS_HELP, allowed=BOUNDS_ALLOWED, factory=TargetBounds)
    exclude: list[str] = setting(help="columns of the shipped schema left out of the features, e.g. [education] "
                                 "(education_num codes the same 16 levels: a linear model with both has aliased "
                                 "terms)", allowed="a list of the schema's numeric or categorical columns",
                                 factory=list)


@dataclass
class TableDataConfig:
    """data=table: your own CSV / Parquet / Stata file and the PUBLIC schema you declare for it."""

    name: str = setting("table", help="the data source; pick it with data=table (a config group)", allowed="table")
    path: str | None = setting(None, help="the file to read (required)",
                               allowed="a .csv, .csv.gz/.bz2/.xz, .parquet, .pq or .dta file, or a folder of "
                               "Parquet files")
    format: str = setting("auto", help="file format; auto: from the file name's suffix",
                          allowed="auto | csv | parquet | dta")
    delimiter: str = setting(",", help="CSV field separator", allowed="one character other than a quote, a line "
                             "break or a space, e.g. ',' ';' or '\\t' (tab)")
    thousands: str | None = setting(None, help=THOUSANDS_HELP, allowed="one of ',' '.' ' ' \"'\" (an apostrophe) "
                                    "| null (no separator)")
    decimal: str = setting(".", help=DECIMAL_HELP, allowed="'.' | ','")
    target: str = setting("", help="the label column (required)", allowed="a column of the file")
    positive: str | None = setting(None, help="the label of the positive class: rows whose target equals it get "
                                   "label 1, rows with data.negative 0, every other row (a missing target included) "
                                   "is left out and counted (private/data_diagnostics.json); null (with "
                                   "data.negative null): the target holds 0/1, rows with anything else are left out",
                                   allowed="a label of the target column (compared as numbers when both are "
                                   "numeric, else as stripped strings) | null")
    negative: str | None = setting(None, help=NEGATIVE_HELP, allowed="a label of the target column, other than "
                                   "data.positive | null (only with data.positive null)")
    classes: list[Any] | None = setting(None, help=CLASSES_HELP, allowed=CLASSES_ALLOWED)
    target_bounds: TargetBounds | None = setting(help=BOUNDS_HELP, allowed=BOUNDS_ALLOWED, factory=TargetBounds)
    numeric: dict[str, NumericColumn] = setting(
        help="numeric feature columns with PUBLIC bounds, e.g. {age: {lower: 17, upper: 90}}; values are clipped "
        "into [lower, upper] (how many were clipped goes to private/data_diagnostics.json) and scaled to [0, 1]",
        allowed="column: {lower: L, upper: U[, transform: log1p]} (lower and upper required)", factory=dict)
    categorical: dict[str, list[Any]] = setting(
        help="categorical feature columns with their PUBLIC labels, one-hot encoded plus an 'other' slot for "
        "anything else (missing values included), e.g. {sex: [Female, Male]}", allowed="column: [label, ...]; "
        "integer codes may be written as numbers ([1, 2, 3]) and match a numeric column stored as 1.0, 2.0, ...; "
        "quote codes with leading zeros (['01', '02']) when the column holds text", factory=dict)
    label_map: dict[str, dict[str, Any]] = setting(help=LABEL_MAP_HELP, allowed=LABEL_MAP_ALLOWED, factory=dict)
    unlisted: str = setting("other", help=UNLISTED_HELP, allowed="other | drop")
    nonfinite: str = setting("drop", help=NONFINITE_HELP, allowed="drop | error")
    split_column: str | None = setting(None, help="a column holding train / test; null: each row goes to the test "
                                       "part when a keyed hash of its own content (key from seed) is below "
                                       "test_fraction", allowed="a column of the file | null")
    test_fraction: float = setting(0.25, help="share of rows in the test part of the per-row hash split (about, not "
                                   "exactly)", allowed="a number in (0, 1)")
    split_key: list[str] | None = setting(None, help="the columns whose content keys the per-row hash split (e.g. "
                                          "[person_id]); null: every column of the file (the whole raw row), so "
                                          "models with different feature sets split the rows alike; with "
                                          "data.privacy_unit: the unit",
                                          allowed="a list of columns of the file | null; with data.privacy_unit: "
                                          "[that column] or null")
    privacy_unit: str | None = setting(None, help=PRIVACY_UNIT_HELP, allowed=PRIVACY_UNIT_ALLOWED)
    test_public: bool = setting(False, help=TEST_PUBLIC_HELP, allowed="true | false")
    sharding: str = setting("auto", help="trainer.distributed=true on a partitioned Parquet data set (a folder of "
                            "Parquet files, or a file with several row groups): each process reads only its own "
                            "row groups (docs/distributed.md); auto: when the data set has at least 2 row groups; "
                            "row_groups: always (refused when it cannot); off: every process reads the whole table",
                            allowed="auto | row_groups | off")
    cache: str | None = setting(None, help="a folder for the ENCODED rows (PRIVATE: keep it beside the data, never "
                                "publish it): the first run with this file, schema and seed writes them there, later "
                                "runs (a sweep) memory-map them instead of reading and encoding the file "
                                "(docs/large_tables.md); null: no cache", allowed="a folder path | null")


@dataclass
class SyntheticDataConfig:
    """data=synthetic: seeded generated data (tests, smoke runs): features x0..x{n-1} uniform in
    [-1, 1], label y ~ Bernoulli(sigmoid(w'x)) with weights w drawn from the same seed."""

    name: str = setting("synthetic", help="the data source; pick it with data=synthetic (a config group)",
                        allowed="synthetic")
    n_rows: int = setting(4000, help="rows generated (seeded by the run's seed)", allowed="an integer >= 2")
    n_features: int = setting(10, help="feature columns x0..x{n_features-1}", allowed="an integer >= 1")
    numeric: dict[str, NumericColumn] = setting(
        help="bounds of generated columns; a column not listed gets the generator's range [-1, 1]",
        allowed="x<i>: {lower: L, upper: U}", factory=dict)
    test_fraction: float = setting(0.25, help="share of rows in the test part (per-row hash split)",
                                   allowed="a number in (0, 1)")
    test_public: bool = setting(True, help=TEST_PUBLIC_HELP + " (generated rows are nobody's data)",
                                allowed="true | false")


@dataclass
class PanelDataConfig:
    """data=panel: a generated panel (dptrain/data/synthetic.py, make_panel): persons with 1 to
    max_rows rows each (heavy-tailed), features x0..x{n-1} in [-1, 1], a known logistic truth;
    the unit column is person_id. Seeded by the run's seed; no download."""

    name: str = setting("panel", help="the data source; pick it with data=panel (a config group)", allowed="panel")
    n_units: int = setting(100_000, help="persons generated (seeded by the run's seed)", allowed="an integer >= 2")
    max_rows: int = setting(20, help="the most rows of one person (rows per person: P(m) proportional to m^-1.2 "
                            "on 1..max_rows)", allowed="an integer in [1, 1000]")
    n_features: int = setting(10, help="feature columns x0..x{n_features-1}", allowed="an integer >= 1")
    privacy_unit: str | None = setting(None, help=PRIVACY_UNIT_HELP, allowed="person_id | null")
    test_fraction: float = setting(0.25, help="share of rows in the test part (hash split; by person with "
                                   "data.privacy_unit)", allowed="a number in (0, 1)")
    test_public: bool = setting(True, help=TEST_PUBLIC_HELP + " (generated rows are nobody's data)",
                                allowed="true | false")


@dataclass
class AtlasDataConfig:
    """data=atlas (task=release): simulated Opportunity-Atlas-like cells, seeded by the run's seed;
    x and y are percentile ranks in the public domain [0, 1]."""

    name: str = setting("atlas", help="the data source; pick it with data=atlas (a config group)", allowed="atlas")
    generator: str = setting("atlas", help="atlas: skewed cell sizes, a cell covariate, 20 states; figure2: the "
                             "paper's Figure 2 design (3 cells for each N = 20..299)", allowed="atlas | figure2")
    n_cells: int = setting(2000, help="cells simulated (generator=atlas)", allowed="an integer >= 2")


#: data source name -> its schema (conf/data/NAME.yaml extends /schema/data/NAME)
DATA_SOURCES: dict[str, type] = {"adult": AdultDataConfig, "table": TableDataConfig,
                                 "synthetic": SyntheticDataConfig, "panel": PanelDataConfig,
                                 "atlas": AtlasDataConfig}
