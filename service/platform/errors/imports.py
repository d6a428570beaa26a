"""Why the pipeline import policy refused a fetch: one code per rule, so that a client can
tell which rule to satisfy."""

from service.platform.errors import FlowbeatError


class ImportRefused(FlowbeatError):
    """An import the policy refuses; each subclass names the rule, so clients can tell why."""

    code = "import_refused"


class ImportsDisabled(ImportRefused):
    code = "imports_disabled"


class ImportRequestInvalid(ImportRefused):
    code = "import_request_invalid"


class ImportSchemeRefused(ImportRefused):
    code = "import_scheme_refused"


class ImportHostNotAllowed(ImportRefused):
    code = "import_host_not_allowed"


class ImportAddressRefused(ImportRefused):
    code = "import_address_refused"


class ImportRedirectRefused(ImportRefused):
    code = "import_redirect_refused"


class ImportContentTypeRefused(ImportRefused):
    code = "import_content_type_refused"


class ImportTooLarge(ImportRefused):
    code = "import_too_large"


class ImportTimeout(ImportRefused):
    code = "import_timeout"


class ImportFetchFailed(ImportRefused):
    """The source answered with an error status, or could not be reached or spoken to."""

    code = "import_fetch_failed"


class ImportPathRefused(ImportRefused):
    code = "import_path_refused"


class ImportNotFound(ImportRefused):
    code = "import_not_found"
