"""Snapshot records in external storage: the golden encoder/decoder, scans, inspection and
card-image files (``docs/blocks/record-format.md``; rules of use
``docs/CONVENTIONS.md#records``).

One module per job, each importing only the ones before it (no module imports this package):

* :mod:`.codec`: the record format: header and payload encoding and decoding, a region's
  import and verify, ring images, a record's bytes between devices, sealing (tags, key rings);
* :mod:`.scan`: the deep scan and the host's rebuild plan, the header scan and the device's
  recovery plan (its golden model);
* :mod:`.listing`: each region's state, the ``storage ls`` table and the fsck report;
* :mod:`.image`: card-image files (survey, open, repair) and the storage tool's ``main``
  (``ringkv storage``, ``python -m ringkv.host.record``).

The package may import the standard library, numpy, :mod:`ringkv.defs`,
:mod:`ringkv.host.errors`, :mod:`ringkv.host.keys` and the golden MAC
(:mod:`ringkv.host.golden.mac`): never a device, the link or the scheduler. It re-exports the
public API of the former ``host/record.py`` (``from ringkv.host.record import X``).
"""

from .codec import (
    Header,
    RecordError,
    check_key_ring,
    check_mac,
    crc32,
    decode_header,
    decode_payload,
    encode_header,
    encode_payload,
    encode_record,
    import_record,
    kind_name,
    read_record_bytes,
    record_tag,
    record_writes,
    ring_dtype,
    ring_image,
    rings_from_image,
    seal_header,
)
from .image import (
    CardImage,
    ImageSurvey,
    main,
    open_card_image,
    read_image_file,
    repair_image,
    survey_image,
)
from .listing import (
    PROBLEM_STATES,
    REPAIRABLE_STATES,
    format_listing,
    fsck_report,
    region_states,
)
from .scan import (
    HeaderInfo,
    RebuildPlan,
    RecordInfo,
    RecoveryPlan,
    check_header,
    plan_rebuild,
    plan_recovery,
    rebuild,
    scan_headers,
    scan_image,
    scan_region,
)

__all__ = [
    "Header", "RecordError", "crc32", "encode_header", "decode_header", "ring_dtype",
    "ring_image", "rings_from_image", "encode_payload", "encode_record", "decode_payload",
    "import_record", "RecordInfo", "scan_region", "scan_image", "RebuildPlan", "plan_rebuild",
    "rebuild", "format_listing", "fsck_report", "HeaderInfo", "check_header", "scan_headers",
    "RecoveryPlan", "plan_recovery", "kind_name", "read_record_bytes", "record_writes", "main",
    "region_states", "PROBLEM_STATES", "ImageSurvey", "survey_image", "CardImage",
    "open_card_image", "read_image_file", "repair_image", "record_tag", "seal_header",
    "REPAIRABLE_STATES",
    "check_mac", "check_key_ring",
]
