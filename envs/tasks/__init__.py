"""The seeded task factory (task families, their checkers, the builder) and what every task
source shares: the task file's checks, its evaluators' registry, the frozen files' store, fetch
and staging. The validator (envs/validate.py) and OSWorld's source (envs/osworld) sit above."""
