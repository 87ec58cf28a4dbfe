# Finds SentencePiece (Debian: libsentencepiece-dev). Defines SentencePiece::sentencepiece.
find_path(SentencePiece_INCLUDE_DIR sentencepiece_processor.h)
find_library(SentencePiece_LIBRARY sentencepiece)
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(SentencePiece
  REQUIRED_VARS SentencePiece_INCLUDE_DIR SentencePiece_LIBRARY)
if(SentencePiece_FOUND AND NOT TARGET SentencePiece::sentencepiece)
  add_library(SentencePiece::sentencepiece UNKNOWN IMPORTED)
  set_target_properties(SentencePiece::sentencepiece PROPERTIES
    IMPORTED_LOCATION "${SentencePiece_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${SentencePiece_INCLUDE_DIR}")
endif()
mark_as_advanced(SentencePiece_INCLUDE_DIR SentencePiece_LIBRARY)
