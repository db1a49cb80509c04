"""The tools' logic: each command of tools/ is a module here with ``main(argv)`` (tools/<name>.py
only calls it): :mod:`.train_net` and :mod:`.lazyconfig_train_net` (training and evaluation with
either config system), :mod:`.predict`, :mod:`.export_model`, :mod:`.demo`,
:mod:`.check_dataset`, :mod:`.convert_timm_checkpoint`, :mod:`.ap_table`,
:mod:`.compare_backbones` (over :mod:`.compare`) and :mod:`.param_counts`. What they share:
command lines and user errors in one line (:mod:`.arguments`), the checks several commands run
(:mod:`.checks`), run-folder policy (:mod:`.output_dir`) and interrupted runs
(:mod:`.interrupts`). The benchmarks' commands (tools/benchmark_lambda.py,
tools/benchmark_detector.py, tools/count_kernels.py) are in benchmarks/ of the checkout, which
is not installed. tools/build_detectron2.py and tools/detectron2_C_stub.py are stdlib-only
scripts, which run before lambda_det is installed; tools/detectron2_tests_conftest.py is a
conftest.py to copy into detectron2's tests/."""
