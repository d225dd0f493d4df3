# A queuejob hook for the test server (scripts/pbs-server.sh): a job's project is its account
# (-A), so that per-project limits ([p:PBS_GENERIC=N]) count a project's jobs as ALCF's do.
import pbs

job = pbs.event().job
if job.Account_Name:
    job.project = job.Account_Name
pbs.event().accept()
