"""The options defined once, for all who read them: those that make a plan (plan.py: the command
line's flags, the Python API's keywords and the planner's Request are made from them) and those
every trainer takes (run.py: the trainers' Config and the workload specs read them). Both are
light and below every reader: the command line builds its parser from one at each start, and the
other runs in the job's own Python."""
