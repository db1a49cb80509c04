"""The tools' logic (tools/*.py are thin scripts over these modules): command lines, user errors
in one line, run-folder policy (:mod:`.output_dir`), training with either config
system (:mod:`.train_net`) and backbone comparisons over seeds (:mod:`.compare`)."""
