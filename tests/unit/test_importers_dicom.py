"""The DICOM importer, on series the tests write with pydicom: labels from metadata only."""

from __future__ import annotations

import numpy as np
import pytest
from pydicom.dataset import Dataset, FileMetaDataset
from pydicom.uid import CTImageStorage, ExplicitVRLittleEndian, MRImageStorage

from benchmark.errors import BenchmarkInvalid
from benchmark.importers import dicom, run_import
from benchmark.importers.common import pseudonym

ORIENTATIONS = {
    "axial": [1, 0, 0, 0, 1, 0],
    "coronal": [1, 0, 0, 0, 0, -1],
    "sagittal": [0, 1, 0, 0, 0, -1],
}


def write_series(folder, uid, *, modality="MR", plane="axial", slices=5, patient="P1", **tags):
    folder.mkdir(parents=True, exist_ok=True)
    rows, cols = 24, 20
    orientation = ORIENTATIONS[plane]
    normal = np.cross(orientation[:3], orientation[3:])
    for k in range(slices):
        meta = FileMetaDataset()
        meta.MediaStorageSOPClassUID = MRImageStorage if modality == "MR" else CTImageStorage
        meta.MediaStorageSOPInstanceUID = f"{uid}.{k + 1}"
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        ds = Dataset()
        ds.file_meta = meta
        ds.SOPClassUID = meta.MediaStorageSOPClassUID
        ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
        ds.Modality = modality
        ds.PatientID = patient
        ds.StudyInstanceUID = "1.2.826.0.1.1"
        ds.SeriesInstanceUID = uid
        ds.InstanceNumber = slices - k  # reversed: order must come from the positions
        ds.ImageOrientationPatient = [float(v) for v in orientation]
        ds.ImagePositionPatient = [float(v) for v in normal * 2.0 * k]
        for key, value in tags.items():
            setattr(ds, key, value)
        ds.Rows, ds.Columns = rows, cols
        ds.SamplesPerPixel = 1
        ds.PhotometricInterpretation = "MONOCHROME2"
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        pixels = np.full((rows, cols), 100 + 50 * k, dtype=np.uint16)
        pixels[5:15, 4:12] += 400
        ds.PixelData = pixels.tobytes()
        ds.save_as(folder / f"slice{k:03d}.dcm", enforce_file_format=True)


@pytest.fixture(scope="module")
def dicom_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("dicom")
    write_series(root / "s1", "1.2.3.1", plane="axial", slices=11, SeriesDescription="AX T1 POST GAD",
                 BodyPartExamined="BRAIN", RepetitionTime=500, EchoTime=10)  # fmt: skip
    write_series(root / "s2", "1.2.3.2", plane="sagittal", SeriesDescription="",
                 StudyDescription="MRI HEAD", RepetitionTime=9000, EchoTime=120,
                 InversionTime=2500)  # fmt: skip
    write_series(root / "s3", "1.2.3.3", plane="coronal", SeriesDescription="localizer",
                 BodyPartExamined="HEAD", RepetitionTime=100, EchoTime=50)  # fmt: skip
    write_series(root / "s4", "1.2.3.4", modality="CT", plane="axial", slices=1,
                 BodyPartExamined="CHEST", patient="P2")  # fmt: skip
    (root / "README.txt").write_text("exported from PACS")
    return root


def test_labels_come_from_metadata(dicom_dir, tmp_path):
    items = run_import("dicom", dicom_dir, tmp_path / "store").items()
    by_series = {}
    for row in items.to_dict(orient="records"):
        by_series.setdefault(row["item_id"].split("_s")[0], []).append(row)
    s1, s2, s3, s4 = (by_series[pseudonym("series", f"1.2.3.{k}")] for k in range(1, 5))

    def answers(rows, task):
        return {r["answer"] for r in rows if r["task"] == task}

    assert answers(s1, "sequence") == {"T1ce"} and answers(s1, "plane") == {"axial"}
    assert answers(s2, "sequence") == {"FLAIR"} and answers(s2, "plane") == {"sagittal"}
    assert answers(s3, "sequence") == set() and {r["sequence"] for r in s3} == {"unknown"}
    assert answers(s3, "plane") == {"coronal"}
    assert answers(s1, "is_brain") == answers(s2, "is_brain") == {"yes"}
    assert answers(s4, "is_brain") == {"no"} and answers(s4, "modality") == {"CT"}
    assert answers(s1, "modality") == {"MRI"}
    # Depths 0.4/0.5/0.6 of an 11-slice series are slices 4, 5 and 6; of 5 slices, slice 2 only.
    assert {r["depth"] for r in s1} == {0.4, 0.5, 0.6}
    assert {r["depth"] for r in s2} == {0.5}
    assert len({r["image_path"] for r in s4}) == 1
    # No patient data: subject ids are pseudonyms.
    assert set(items["subject_id"]) == {pseudonym("patient", "P1"), pseudonym("patient", "P2")}


def test_sequence_from_metadata():
    seq = dicom.sequence_from_metadata
    assert seq("t2_tse_tra", None, None, None) == "T2"
    assert seq("Sag T1 MPRAGE", None, None, None) == "T1"
    assert seq("T1 MPRAGE", None, None, None, contrast_agent="Gadovist") == "T1ce"
    assert seq("ep2d_diff_3scan_trace", None, None, None) == "DWI"
    assert seq("TOF_3D_multi-slab", None, None, None) == "MRA"
    assert seq("PD_TSE", None, None, None) == "PD"
    assert seq("", 2500, 15, None) == "PD"
    assert seq("", 4000, 100, None) == "T2"
    assert seq("", 9000, 120, 2500) == "FLAIR"
    assert seq("", 450, 12, None) == "T1"
    assert seq("survey", 1000, 50, None) == "unknown"
    assert seq("", None, None, None) == "unknown"


def test_malformed_dicom_is_named(dicom_dir, tmp_path):
    import shutil

    src = tmp_path / "bad"
    shutil.copytree(dicom_dir, src)
    (src / "s1" / "slice000.dcm").write_bytes(b"this is not dicom")
    truncated = (src / "s2" / "slice001.dcm").read_bytes()[:300]
    (src / "s2" / "slice001.dcm").write_bytes(truncated)
    write_series(src / "s5", "1.2.3.5", slices=1, SeriesDescription="T2")
    import pydicom

    ds = pydicom.dcmread(src / "s5" / "slice000.dcm")
    del ds.SeriesInstanceUID
    ds.save_as(src / "s5" / "slice000.dcm")
    store = tmp_path / "store"
    with pytest.raises(BenchmarkInvalid) as err:
        run_import("dicom", src, store)
    text = "\n".join(err.value.problems)
    assert f"{src / 's1' / 'slice000.dcm'}: not a DICOM file" in text
    assert f"{src / 's2' / 'slice001.dcm'}:" in text
    assert f"{src / 's5' / 'slice000.dcm'}: missing SeriesInstanceUID" in text
    assert not store.exists() or not any(store.iterdir())
