-- 0002 down: nothing to undo that 0001 does not also build. The baseline
-- applies the live schema files, which define the column, the open's
-- p_trace_context (NULL by default, so a call without it is the call 0001's
-- code makes) and the view's column; and dropping the column would break the
-- view and the function bodies that read it, which a downgrade cannot bring
-- back as they were (CONTRIBUTING.md: production rolls forward).
SELECT 1;
