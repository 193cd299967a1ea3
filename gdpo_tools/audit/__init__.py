"""``gdpo audit``: read a dumped batch and say what GDPO will do with it, in words, with what to do
about each finding. Its formats, findings, exit codes and JSON schema: docs/audit.md."""

from gdpo_tools.audit.findings import KINDS  # noqa: F401
from gdpo_tools.audit.read import AuditDtypeError, AuditInputError, Batch, read_batch  # noqa: F401
from gdpo_tools.audit.report import main  # noqa: F401
from gdpo_tools.audit.run import DISAGREE, NOT_AUDITED, OK, SCHEMA, WARN, audit  # noqa: F401
