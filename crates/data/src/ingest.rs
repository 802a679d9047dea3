//! Reading documents from `.txt` files (one document per file, folders walked recursively),
//! JSONL (one document per line, from its `text` field) and Parquet (one document per row of
//! the `text` column, FineWeb's layout).
//!
//! Files are visited in sorted path order so every machine sees the same document sequence.
//! Each problem is an [`IngestError`] that names the file and the position; the caller
//! decides whether it is fatal or a skipped document (`--skip-bad`).

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use arrow::array::{
    Array, BinaryArray, LargeBinaryArray, LargeStringArray, StringArray, StringViewArray,
};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use thiserror::Error;

/// A problem reading the input.
#[derive(Debug, Error)]
pub enum IngestError {
    #[error("input {path} does not exist or cannot be read: {source}")]
    Missing {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: unsupported file type (expected .txt, .jsonl or .parquet)")]
    Unsupported { path: PathBuf },
    #[error("no .txt, .jsonl or .parquet files found under the given inputs")]
    NoFiles,
    #[error("{path}: read failed: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: invalid UTF-8 at {position}")]
    InvalidUtf8 { path: PathBuf, position: String },
    #[error("{path}: line {line}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        line: u64,
        source: serde_json::Error,
    },
    #[error("{path}: line {line}: no string field \"text\"")]
    MissingTextField { path: PathBuf, line: u64 },
    #[error("{path}: parquet: {source}")]
    Parquet {
        path: PathBuf,
        source: parquet::errors::ParquetError,
    },
    #[error("{path}: after row {row}: {source}")]
    Arrow {
        path: PathBuf,
        row: u64,
        source: arrow::error::ArrowError,
    },
    #[error("{path}: no \"text\" column of strings")]
    NoTextColumn { path: PathBuf },
    #[error("{path}: row {row}: \"text\" is null")]
    NullText { path: PathBuf, row: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Txt,
    Jsonl,
    Parquet,
}

fn kind_of(path: &Path) -> Option<Kind> {
    match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
        "txt" => Some(Kind::Txt),
        "jsonl" => Some(Kind::Jsonl),
        "parquet" => Some(Kind::Parquet),
        _ => None,
    }
}

/// One input file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputFile {
    pub path: PathBuf,
    kind: Kind,
    /// Size on disk, for progress.
    pub bytes: u64,
}

/// Expands the user's input paths: a file is taken as is (its type from the extension), a
/// folder is walked recursively for known extensions, everything else in it is ignored.
pub fn discover(inputs: &[PathBuf]) -> Result<Vec<InputFile>, IngestError> {
    let mut files = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input).map_err(|source| IngestError::Missing {
            path: input.clone(),
            source,
        })?;
        if meta.is_dir() {
            walk(input, &mut files)?;
        } else {
            let kind = kind_of(input).ok_or_else(|| IngestError::Unsupported {
                path: input.clone(),
            })?;
            files.push(InputFile {
                path: input.clone(),
                kind,
                bytes: meta.len(),
            });
        }
    }
    if files.is_empty() {
        return Err(IngestError::NoFiles);
    }
    Ok(files)
}

fn walk(dir: &Path, out: &mut Vec<InputFile>) -> Result<(), IngestError> {
    let io = |source| IngestError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io)?;
    entries.sort();
    for path in entries {
        let meta = std::fs::metadata(&path).map_err(|source| IngestError::Io {
            path: path.clone(),
            source,
        })?;
        if meta.is_dir() {
            walk(&path, out)?;
        } else if let Some(kind) = kind_of(&path) {
            out.push(InputFile {
                path,
                kind,
                bytes: meta.len(),
            });
        }
    }
    Ok(())
}

/// One document's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Document {
    pub text: String,
}

/// Streams documents from files in order. A file-level failure ends that file; a line- or
/// row-level failure in JSONL/Parquet is reported and reading goes on with the next one.
pub struct Documents {
    files: std::vec::IntoIter<InputFile>,
    current: Option<Reader>,
}

enum Reader {
    Jsonl {
        path: PathBuf,
        /// `None` after a read error: the rest of the file is abandoned.
        reader: Option<BufReader<File>>,
        line: u64,
    },
    Parquet {
        path: PathBuf,
        /// `None` after a decode error: the rest of the file is abandoned.
        reader: Option<ParquetRecordBatchReader>,
        pending: std::vec::IntoIter<Result<Document, IngestError>>,
        row: u64,
    },
}

impl Documents {
    pub fn new(files: &[InputFile]) -> Documents {
        Documents {
            files: Vec::from(files).into_iter(),
            current: None,
        }
    }
}

impl Iterator for Documents {
    type Item = Result<Document, IngestError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(reader) = &mut self.current {
                match reader.next_doc() {
                    Some(item) => return Some(item),
                    None => self.current = None,
                }
            }
            let file = self.files.next()?;
            match file.kind {
                Kind::Txt => return Some(read_txt(&file.path)),
                Kind::Jsonl => match File::open(&file.path) {
                    Ok(f) => {
                        self.current = Some(Reader::Jsonl {
                            path: file.path,
                            reader: Some(BufReader::new(f)),
                            line: 0,
                        })
                    }
                    Err(source) => {
                        return Some(Err(IngestError::Io {
                            path: file.path,
                            source,
                        }));
                    }
                },
                Kind::Parquet => match open_parquet(&file.path) {
                    Ok(reader) => {
                        self.current = Some(Reader::Parquet {
                            path: file.path,
                            reader: Some(reader),
                            pending: Vec::new().into_iter(),
                            row: 0,
                        })
                    }
                    Err(e) => return Some(Err(e)),
                },
            }
        }
    }
}

fn read_txt(path: &Path) -> Result<Document, IngestError> {
    let mut bytes = Vec::new();
    File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .map_err(|source| IngestError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let at = e.utf8_error().valid_up_to();
        let prefix = &e.as_bytes()[..at];
        let line = prefix.iter().filter(|&&b| b == b'\n').count() + 1;
        let column = at
            - prefix
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |p| p + 1)
            + 1;
        IngestError::InvalidUtf8 {
            path: path.to_path_buf(),
            position: format!("byte offset {at} (line {line}, column {column})"),
        }
    })?;
    Ok(Document { text })
}

fn open_parquet(path: &Path) -> Result<ParquetRecordBatchReader, IngestError> {
    let pq = |source| IngestError::Parquet {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(|source| IngestError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(pq)?;
    let column = builder
        .schema()
        .fields()
        .iter()
        .position(|f| f.name() == "text")
        .ok_or_else(|| IngestError::NoTextColumn {
            path: path.to_path_buf(),
        })?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), [column]);
    builder
        .with_projection(mask)
        .with_batch_size(1024)
        .build()
        .map_err(pq)
}

impl Reader {
    fn next_doc(&mut self) -> Option<Result<Document, IngestError>> {
        match self {
            Reader::Jsonl { path, reader, line } => loop {
                let r = reader.as_mut()?;
                let mut buf = Vec::new();
                *line += 1;
                match r.read_until(b'\n', &mut buf) {
                    Ok(0) => return None,
                    Ok(_) => {}
                    Err(source) => {
                        // An unreadable stream will not recover: report once, end this file.
                        *reader = None;
                        return Some(Err(IngestError::Io {
                            path: path.clone(),
                            source: std::io::Error::new(
                                source.kind(),
                                format!("line {line}: {source}"),
                            ),
                        }));
                    }
                }
                if buf.iter().all(|b| b.is_ascii_whitespace()) {
                    continue;
                }
                return Some(parse_jsonl_line(path, *line, &buf));
            },
            Reader::Parquet {
                path,
                reader,
                pending,
                row,
            } => loop {
                if let Some(item) = pending.next() {
                    return Some(item);
                }
                match reader.as_mut()?.next()? {
                    Ok(batch) => {
                        let docs = batch_texts(path, *row, batch.column(0).as_ref());
                        *row += batch.num_rows() as u64;
                        *pending = docs.into_iter();
                    }
                    Err(source) => {
                        let err = IngestError::Arrow {
                            path: path.clone(),
                            row: *row,
                            source,
                        };
                        // A corrupt page poisons the rest of the file: stop reading it.
                        *reader = None;
                        return Some(Err(err));
                    }
                }
            },
        }
    }
}

fn parse_jsonl_line(path: &Path, line: u64, buf: &[u8]) -> Result<Document, IngestError> {
    let s = std::str::from_utf8(buf).map_err(|e| IngestError::InvalidUtf8 {
        path: path.to_path_buf(),
        position: format!("line {line}, byte {}", e.valid_up_to() + 1),
    })?;
    let value: serde_json::Value = serde_json::from_str(s).map_err(|source| IngestError::Json {
        path: path.to_path_buf(),
        line,
        source,
    })?;
    match value.get("text").and_then(|t| t.as_str()) {
        Some(text) => Ok(Document {
            text: text.to_owned(),
        }),
        None => Err(IngestError::MissingTextField {
            path: path.to_path_buf(),
            line,
        }),
    }
}

/// Row texts of one record batch column; rows are numbered from 1 in messages.
fn batch_texts(path: &Path, first_row: u64, col: &dyn Array) -> Vec<Result<Document, IngestError>> {
    let null = |i: usize| IngestError::NullText {
        path: path.to_path_buf(),
        row: first_row + i as u64 + 1,
    };
    let text = |s: &str| Ok(Document { text: s.to_owned() });
    let bytes = |i: usize, b: &[u8]| match std::str::from_utf8(b) {
        Ok(s) => text(s),
        Err(e) => Err(IngestError::InvalidUtf8 {
            path: path.to_path_buf(),
            position: format!("row {}, byte {}", first_row + i as u64 + 1, e.valid_up_to()),
        }),
    };
    let any = col.as_any();
    let n = col.len();
    let get = |i: usize| -> Result<Document, IngestError> {
        if col.is_null(i) {
            return Err(null(i));
        }
        if let Some(a) = any.downcast_ref::<StringArray>() {
            text(a.value(i))
        } else if let Some(a) = any.downcast_ref::<LargeStringArray>() {
            text(a.value(i))
        } else if let Some(a) = any.downcast_ref::<StringViewArray>() {
            text(a.value(i))
        } else if let Some(a) = any.downcast_ref::<BinaryArray>() {
            bytes(i, a.value(i))
        } else if let Some(a) = any.downcast_ref::<LargeBinaryArray>() {
            bytes(i, a.value(i))
        } else {
            Err(IngestError::NoTextColumn {
                path: path.to_path_buf(),
            })
        }
    };
    (0..n).map(get).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn texts(files: &[InputFile]) -> Vec<Result<String, String>> {
        Documents::new(files)
            .map(|d| d.map(|d| d.text).map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn folders_are_walked_in_sorted_order_and_other_files_ignored() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("b.txt"), "bee").unwrap();
        std::fs::write(dir.path().join("a.txt"), "ay").unwrap();
        std::fs::write(dir.path().join("sub/c.txt"), "sea").unwrap();
        std::fs::write(dir.path().join("notes.md"), "ignored").unwrap();
        let files = discover(&[dir.path().to_path_buf()]).unwrap();
        assert_eq!(
            texts(&files),
            vec![Ok("ay".into()), Ok("bee".into()), Ok("sea".into())]
        );
    }

    #[test]
    fn jsonl_lines_and_their_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.jsonl");
        let mut f = File::create(&path).unwrap();
        f.write_all(b"{\"text\": \"one\", \"id\": 1}\n\n{\"nope\": 2}\nnot json\n")
            .unwrap();
        f.write_all(b"{\"text\": \"\xff\"}\n{\"text\": \"two\"}")
            .unwrap();
        let got = texts(&discover(&[path]).unwrap());
        assert_eq!(got[0], Ok("one".into()));
        assert!(got[1].as_ref().unwrap_err().contains("line 3"), "{got:?}");
        assert!(
            got[2]
                .as_ref()
                .unwrap_err()
                .contains("line 4: invalid JSON")
        );
        assert!(
            got[3]
                .as_ref()
                .unwrap_err()
                .contains("invalid UTF-8 at line 5")
        );
        assert_eq!(got[4], Ok("two".into()));
        assert_eq!(got.len(), 5);
    }

    #[test]
    fn invalid_utf8_in_txt_names_file_and_position() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.txt");
        std::fs::write(&path, b"ok\nfine \xc3\x28 here").unwrap();
        let err = texts(&discover(std::slice::from_ref(&path)).unwrap())[0]
            .clone()
            .unwrap_err();
        assert!(err.contains("bad.txt"), "{err}");
        assert!(err.contains("byte offset 8 (line 2, column 6)"), "{err}");
    }

    #[test]
    fn missing_and_unsupported_inputs() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert!(matches!(
            discover(std::slice::from_ref(&missing)),
            Err(IngestError::Missing { .. })
        ));
        let csv = dir.path().join("x.csv");
        std::fs::write(&csv, "a").unwrap();
        assert!(matches!(
            discover(&[csv]),
            Err(IngestError::Unsupported { .. })
        ));
        let empty = dir.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert!(matches!(discover(&[empty]), Err(IngestError::NoFiles)));
    }
}
