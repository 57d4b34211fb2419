"""The schemas of every task's settings (the dataclasses Hydra composes the config against), in
modules that import neither torch nor pandas, scipy, scikit-learn, matplotlib or opacus: the
command line composes and checks a config with them (:mod:`dptrain.settings.launch`) before the
tasks load (docs/performance.md, "A refusal"). The checks of the values stay in
:mod:`dptrain.settings.train`, :mod:`dptrain.settings.release`, ... which re-export these names."""
